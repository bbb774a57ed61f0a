"""``link_params=True``: the weights live inside the kernel library.

:func:`linked_params_module` emits a C source module (type key ``"c"``, DSO-exportable, so
``export_library`` compiles it into the same shared library as the kernels) holding every
param as a 64-byte aligned constant array, plus one packed function (TVM's convention)::

    _lookup_linked_param(name: str | index: int) -> void* (type code 3), or NULL (code 4)

The graph JSON still has an argument node per param (same names), so an executor binds each
param entry to the pointer returned for its name — zero copy, no params blob (the graph
executor does this when it is created; :func:`load_linked_params` returns copies).

The bytes are written as C string literals of ``\\xHH`` escapes: compilers parse these far
faster than brace initializer lists, and the result is plain C that the ``.tar`` export
path can recompile anywhere.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Mapping

import numpy as np

__all__ = ["LOOKUP_FUNC", "linked_params_module", "load_linked_params"]

#: Name of the packed lookup function a linked-params library exports.
LOOKUP_FUNC = "_lookup_linked_param"

_HEX = [f"\\x{b:02x}" for b in range(256)]


def _c_bytes(data: bytes, per_line: int = 48) -> str:
    lines = []
    for i in range(0, len(data), per_line):
        lines.append('  "' + "".join(_HEX[b] for b in data[i:i + per_line]) + '"')
    return "\n".join(lines) if lines else '  ""'


def linked_params_module(params: Mapping[str, Any], mod_name: str = "default") -> Any:
    """A C source module embedding ``params`` and exporting :data:`LOOKUP_FUNC`.

    Parameters
    ----------
    params : dict of str to array
        Param arrays keyed by arg-node name.
    mod_name : str
        Only used in comments.

    Returns
    -------
    kiln.runtime.CSourceModule
    """
    from ..runtime.csource import csource_module

    names = list(params)
    parts = [
        f"/* Kiln linked params of module {mod_name!r}: {len(names)} arrays. Generated. */",
        "#include <kiln/c_runtime_api.h>",
        "#include <string.h>",
        "",
    ]
    for k, name in enumerate(names):
        arr = params[name]
        if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
            arr = arr.numpy()
        data = np.ascontiguousarray(arr).tobytes()
        # The array has exactly len(data) bytes: the literal's NUL terminator is dropped (C).
        size = max(len(data), 1)
        parts.append(f"/* {name}: {tuple(np.shape(arr))} {np.asarray(arr).dtype} */")
        parts.append(f"static const unsigned char kiln_lp_{k}[{size}] __attribute__((aligned(64))) =")
        parts.append(_c_bytes(data) + ";")
    parts.append("")
    parts.append(f"static const char* const kiln_lp_names[{max(len(names), 1)}] = {{"
                 + ", ".join(json.dumps(n) for n in names) + ("" if names else "0") + "};")
    parts.append(f"static const void* const kiln_lp_data[{max(len(names), 1)}] = {{"
                 + ", ".join(f"kiln_lp_{k}" for k in range(len(names))) + ("" if names else "0")
                 + "};")
    parts.append(f"""
KILN_DLL int32_t {LOOKUP_FUNC}(KilnValue* args, int32_t* type_codes, int32_t num_args,
                               KilnValue* out_ret_value, int32_t* out_ret_tcode,
                               void* resource_handle) {{
  (void)resource_handle;
  int64_t idx = -1;
  if (num_args != 1) {{
    KilnAPISetLastError("{LOOKUP_FUNC}: expected one argument (param name or index)");
    return -1;
  }}
  if (type_codes[0] == kKilnStr) {{
    for (int64_t i = 0; i < {len(names)}; ++i) {{
      if (strcmp(kiln_lp_names[i], args[0].v_str) == 0) {{ idx = i; break; }}
    }}
  }} else if (type_codes[0] == kKilnArgInt) {{
    idx = args[0].v_int64;
  }} else {{
    KilnAPISetLastError("{LOOKUP_FUNC}: argument must be a str or an int");
    return -1;
  }}
  if (idx < 0 || idx >= {len(names)}) {{
    out_ret_value->v_handle = 0;
    *out_ret_tcode = kKilnNullptr;
  }} else {{
    out_ret_value->v_handle = (void*)kiln_lp_data[idx];
    *out_ret_tcode = kKilnOpaqueHandle;
  }}
  return 0;
}}
""")
    mod = csource_module("\n".join(parts), [LOOKUP_FUNC])
    # export_library's C API tables treat these argument nodes as params, not inputs (in memory
    # only: a library loaded back is not re-exported).
    setattr(mod, "linked_param_names", list(names))  # noqa: B010 - an attribute CSourceModule does not declare
    return mod


def load_linked_params(lib: Any, graph_json: str | Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Read the params a linked-params library carries (copies), by graph arg-node name.

    Parameters
    ----------
    lib : Module
        The kernel library, an executor factory or a loaded module (imports are searched).
    graph_json : str or dict, optional
        Names, shapes and dtypes of the args; taken from ``lib.get_graph_json()`` when ``lib``
        is a factory.

    Returns
    -------
    dict of str to numpy.ndarray
        Empty when the library has no :data:`LOOKUP_FUNC`.
    """
    from ..runtime.errors import FunctionNotFoundError

    if graph_json is None:
        graph_json = lib.get_graph_json()
    g = json.loads(graph_json) if isinstance(graph_json, str) else dict(graph_json)
    try:
        lookup = lib.get_function(LOOKUP_FUNC, query_imports=True)
    except FunctionNotFoundError:
        return {}
    from ..ir.types import np_dtype

    out: dict[str, np.ndarray] = {}
    row_ptr = g["node_row_ptr"]
    dltype = g["attrs"]["dltype"][1]
    shape = g["attrs"]["shape"][1]
    for nid in g["arg_nodes"]:
        name = g["nodes"][nid]["name"]
        addr = lookup(name)
        if not addr:
            continue
        eid = row_ptr[nid]
        dt = np_dtype(dltype[eid])
        shp = tuple(shape[eid])
        nbytes = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        buf = ctypes.string_at(int(addr), nbytes)
        out[name] = np.frombuffer(buf, dtype=dt).reshape(shp).copy()
    return out
