"""The GPU device-module base: function table, payload codec, argument checks, temporaries, launch.

Owns what every GPU module type (``cuda``, ``opencl``, plug-ins) has in common, so that a
backend is only its driver bindings, its device API and a small :class:`GPUModule` subclass
that loads a program and launches one kernel (the split tinygrad makes between allocator,
compiler and program). Imports NumPy + stdlib only, like all of :mod:`kiln.runtime`, and never
a device driver: a payload can be decoded and described on a machine without one.

Function table
--------------
A packed function of a GPU module (what the graph JSON's ``func_name`` names) is a
:class:`GPUFunction`: its arguments (:class:`GPUArg`), the byte sizes of its device
temporaries, and the kernel launches it makes in order (:class:`GPULaunch`). A launch names
its kernel, its grid (blocks / work-groups) and block (threads / work-items) and the
function arguments it takes by index; an index ``i >= len(args)`` is temporary
``i - len(args)``, and one past the temporaries is runtime extent ``i - len(args) -
len(temps)``. Launch sizes are fixed at compile time (the upper bounds, for dynamic dims);
a launch of a dynamic function may also carry a *run-time grid* (``GPULaunch.dyn_grid``), see
Launching.

A function with dynamic dimensions (``docs/dynamic_shapes.md``) has *runtime extents*
(:class:`GPUExtent`): each is the actual size of some dims of its tensor arguments, which
are stored at their upper-bound shape (the padded layout). The launcher takes the arguments'
actual shapes (``shapes=``, what the graph executor passes), checks them and hands each
kernel the extents it reads as scalar parameters after its buffers.

Payload (``save_to_binary``), version 2, 3 or 4, little-endian; a *string* is a u64 length
and that many bytes (UTF-8 for text)::

    8 bytes   magic of the module type (b"KILNCUDA", b"KILNOCL\\0", ...)
    u32       payload version (2; 3 when a function has runtime extents; 4 when, in
              addition, a launch has a run-time grid)
    string    binary format ("ptx", "cubin", "cl", ...)
    string    target architecture ("sm_90"; may be empty)
    string    the binary the driver loads (may be empty when the source is what it compiles)
    string    source (CUDA C, OpenCL C; may be empty)
    u64       number of functions; per function:
      string    name
      u64       number of arguments; per argument: u8 kind (0 tensor, 1 int, 2 float),
                string name, string dtype, u64 ndim, i64 shape[ndim]
      u64       number of temporaries, u64 byte size each
      (version >= 3) u64 number of runtime extents; per extent: string name, string
                dtype ("int32" / "int64"), u64 count, (u32 argument, u32 dim) each
      u64       number of launches; per launch: string kernel, u32 grid[3], u32 block[3],
                u32 dynamic shared bytes, u64 count, u32 argument index each,
                (version 4 only) string dyn_grid[3] ("" for a dim that keeps its size;
                at most MAX_GRID_EXPRESSION characters each)

Older payloads (``cuda`` version 1: arguments without names; ``opencl`` version 1: JSON
metadata) are read by the subclasses' :meth:`GPUModule._decode_legacy`.

Device APIs
-----------
:class:`GPUDeviceAPI` is the base of device APIs whose memory the host cannot address: it
sorts every copy into one of four kinds and leaves only :meth:`GPUDeviceAPI._copy` (and
allocation and attributes) to the backend.

Launching
---------
``get_function(name)`` returns a launcher that checks its arguments (count, NDArray on one
device of the module's device type, dtype, shape), loads the program on that device the
first time (:meth:`GPUModule._load`), allocates the temporaries once per device, and hands
the backend a launch plan (:meth:`GPUModule._prepare`), cached for the argument values (and
runtime extents) of the previous call, because the graph executor calls every function with
the same arrays each run. A function with runtime extents also takes ``shapes=``, the actual
shape of each tensor argument (``InputError`` when an extent exceeds its upper bound or two
dims that share it disagree); the extents become ctypes scalars after the temporaries.

A launch with a run-time grid (``dyn_grid``: per grid dim a :mod:`kiln.runtime.sym`
expression over the function's extent names, written by the code generator only where the
work-groups past it provably do nothing) launches ``min(grid, max(0, value))`` work-groups
in that dim; a launch whose grid comes to 0 is left out. The grid is computed when the plan
is (re)built, i.e. only when an extent changes, and the backend's :meth:`GPUModule._prepare`
sees the launches as made (:class:`GPULaunch` s with the actual grid), so a backend needs no
code for it. Block sizes never change (kernels with barriers need full work-groups).
"""

from __future__ import annotations

import abc
import ctypes
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from . import sym
from .binary import Reader, Writer
from .device import ALLOC_ALIGNMENT, Device, DeviceAPI, get_device_api
from .errors import DeviceError, FormatError, InputError, KilnError
from .module import Module

__all__ = [
    "ARG_TENSOR", "ARG_INT", "ARG_FLOAT", "GPUArg", "GPUExtent", "GPULaunch", "GPUFunction", "GPUPayload",
    "GPUModule", "PAYLOAD_VERSION", "DYNAMIC_PAYLOAD_VERSION", "GRID_PAYLOAD_VERSION", "MAX_GRID_EXPRESSION",
    "SCALAR_CTYPES", "GPUDeviceAPI",
]

#: Argument kinds in the function table.
ARG_TENSOR, ARG_INT, ARG_FLOAT = 0, 1, 2
_ARG_KINDS = {ARG_TENSOR: "tensor", ARG_INT: "int", ARG_FLOAT: "float"}

#: Version of the common payload layout written by :meth:`GPUModule.encode_payload`.
PAYLOAD_VERSION = 2
#: The version written when some function has runtime extents (version 2 plus an extent
#: table per function); static modules keep writing version 2, which older Kilns read.
DYNAMIC_PAYLOAD_VERSION = 3
#: The version written when, in addition, some launch has a run-time grid (version 3 plus
#: three grid expressions per launch); modules without one keep writing version 2 or 3.
GRID_PAYLOAD_VERSION = 4

#: The longest run-time grid expression a function table may hold, in characters: parsing
#: and compiling one costs time and stack growing with its length (the code generator's are
#: short: the longest the tests in ``tests/opencl`` and ``tests/cuda`` produce,
#: ``(3200*batch_rt+255)//256``, has 24).
MAX_GRID_EXPRESSION = 256

#: ctypes type of each scalar dtype a kernel may take by value.
SCALAR_CTYPES: dict[str, Any] = {
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool,
}


# ==========================================================================================
# the function table
# ==========================================================================================
@dataclass(frozen=True)
class GPUArg:
    """One argument of a packed function.

    Attributes
    ----------
    kind : int
        ``ARG_TENSOR`` (an NDArray, passed to kernels as a device buffer), ``ARG_INT`` or
        ``ARG_FLOAT`` (a scalar passed by value).
    dtype : str
        Element dtype of a tensor, or the scalar's dtype.
    shape : tuple of int
        Static shape of a tensor (``()`` for scalars and 0-d tensors); checked at call time.
    name : str
        The parameter's name (for error messages; empty in ``cuda`` version-1 payloads).
    """

    kind: int
    dtype: str
    shape: tuple[int, ...] = ()
    name: str = ""


@dataclass(frozen=True)
class GPUExtent:
    """A runtime extent of a function: the actual size of dynamic tensor dims.

    Attributes
    ----------
    name : str
        The dim's variable name (for messages).
    dtype : str
        ``"int32"`` or ``"int64"``: the type of the kernel parameter it is passed as.
    dims : tuple of (int, int)
        ``(argument index, dim)`` of every tensor dim that has this extent; the first gives
        its value, the others must agree. Each dim's static size is the extent's upper bound.
    """

    name: str
    dtype: str
    dims: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class GPULaunch:
    """One kernel launch of a packed function.

    Attributes
    ----------
    kernel : str
        The kernel's name in the program.
    grid, block : tuple of 3 ints
        Blocks (work-groups) and threads per block (work-items per group).
    shared_bytes : int
        Dynamic shared memory per block the launch reserves (statically declared shared /
        local memory is part of the kernel and not counted here).
    args : tuple of int
        Indices into the function's arguments, then temporaries, then runtime extents, in
        kernel parameter order.
    dyn_grid : tuple of str
        Empty, or per grid dim a :mod:`kiln.runtime.sym` expression over the function's
        extent names giving the grid at run time (clamped to ``[0, grid]``; ``""``: the dim
        keeps ``grid``). Only a code generator that proved the work-groups past it idle
        writes one (``kiln.codegen.gpu_source.dynamic_grid``).
    """

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    args: tuple[int, ...] = ()
    dyn_grid: tuple[str, ...] = ()


@dataclass(frozen=True)
class GPUFunction:
    """A packed function: its arguments, temporaries (byte sizes), kernel launches and runtime
    extents (:class:`GPUExtent`, empty for a static function)."""

    name: str
    args: tuple[GPUArg, ...]
    launches: tuple[GPULaunch, ...]
    temps: tuple[int, ...] = ()
    extents: tuple[GPUExtent, ...] = ()

    def check(self, where: str) -> None:
        """Raise :class:`FormatError` unless every launch takes existing arguments, temporaries
        or extents, every extent names a tensor dim of the function, and every run-time grid
        expression is at most :data:`MAX_GRID_EXPRESSION` characters over the extent names
        and compiles as the launcher compiles it (the error names the launch and grid dim)."""
        n = len(self.args) + len(self.temps) + len(self.extents)
        for ln in self.launches:
            for i in ln.args:
                if not 0 <= i < n:
                    raise FormatError(f"{where}: kernel {ln.kernel!r} of {self.name!r} takes argument {i}, but "
                                      f"{self.name!r} has {len(self.args)} arguments, {len(self.temps)} "
                                      f"temporaries and {len(self.extents)} runtime extents")
        for x in self.extents:
            if x.dtype not in ("int32", "int64") or not x.dims:
                raise FormatError(f"{where}: runtime extent {x.name!r} of {self.name!r} has dtype {x.dtype!r} and "
                                  f"{len(x.dims)} dims; expected int32/int64 and at least one dim")
            for i, d in x.dims:
                a = self.args[i] if 0 <= i < len(self.args) else None
                if a is None or a.kind != ARG_TENSOR or not 0 <= d < len(a.shape):
                    raise FormatError(f"{where}: runtime extent {x.name!r} of {self.name!r} is dim {d} of argument "
                                      f"{i}, which is not a dim of a tensor argument")
        names = [x.name for x in self.extents]
        for li, ln in enumerate(self.launches):
            if not ln.dyn_grid:
                continue
            what = f"{where}: run-time grid {list(ln.dyn_grid)} of kernel {ln.kernel!r} of {self.name!r}"
            if len(ln.dyn_grid) != 3 or len(set(names)) != len(names):
                raise FormatError(f"{what}: expected 3 expressions over distinctly named runtime extents {names}")
            for axis, e in zip("xyz", ln.dyn_grid):
                if not e:
                    continue
                what = f"{where}: launch {li} (kernel {ln.kernel!r}) of {self.name!r}, grid dim {axis}"
                if len(e) > MAX_GRID_EXPRESSION:
                    raise FormatError(f"{what}: {len(e)} characters, more than the {MAX_GRID_EXPRESSION} a run-time "
                                      f"grid expression may have ({e:.60}...)")
                try:
                    free = sym.symbols(e)
                    _grid_function([(e, 1, 1)])  # what the launcher compiles
                except (InputError, SyntaxError, RecursionError, MemoryError, ValueError) as err:
                    raise FormatError(f"{what}: bad run-time grid expression {e!r}: {err!r}") from None
                if not free <= set(names):
                    raise FormatError(f"{what}: {e!r} names {sorted(free - set(names))}, which are not runtime "
                                      f"extents of the function ({names})")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "GPU function metadata") -> "GPUFunction":
        """Build from the codegen's metadata dict (``GPUFunctionInfo.to_dict()``).

        That layout names parameters (``{"name", "dtype", "shape"}``), temporaries
        (``{"nbytes", ...}``) and per kernel ``args`` as ``["param", i]`` / ``["temp", j]``;
        a kernel's ``shared_bytes`` there is static work-group memory, so it is not a launch
        parameter and is not kept.

        Raises
        ------
        FormatError
            On a malformed dict, naming what is wrong.
        """
        try:
            name = str(d["name"])
            args = tuple(GPUArg(ARG_TENSOR, str(p["dtype"]), tuple(int(x) for x in p["shape"]), str(p.get("name", "")))
                         for p in d["params"])
            temps = tuple(int(t["nbytes"]) for t in d["temps"])
            extents = tuple(GPUExtent(str(x["name"]), str(x["dtype"]), tuple((int(i), int(k)) for i, k in x["dims"]))
                            for x in d.get("extents", ()))
            base = {"param": 0, "temp": len(args), "extent": len(args) + len(temps)}
            launches = []
            for k in d["kernels"]:
                idx = []
                for where_, i in k["args"]:
                    if where_ not in base:
                        raise ValueError(f"kernel argument {where_!r} is neither 'param' nor 'temp' nor 'extent'")
                    idx.append(int(i) + base[where_])
                grid, block = (tuple(int(x) for x in k[f]) for f in ("grid", "block"))
                if len(grid) != 3 or len(block) != 3 or not all(0 < x < 2**32 for x in (*grid, *block)):
                    raise ValueError(f"grid {list(grid)} / block {list(block)} must be 3 positive u32 each")
                dyn = tuple(str(e) for e in k.get("dyn_grid", ()))
                dyn = dyn if any(dyn) else ()  # no dim with an expression: no run-time grid
                launches.append(GPULaunch(str(k["name"]), grid, block, 0, tuple(idx), dyn))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise FormatError(f"{where}: malformed function metadata ({err!r}) in {d!r:.200}") from None
        f = cls(name, args, tuple(launches), temps, extents)
        f.check(where)
        return f

    def to_dict(self) -> dict[str, Any]:
        """The codegen metadata layout of :meth:`from_dict` (tensor arguments only)."""
        n, t = len(self.args), len(self.args) + len(self.temps)

        def slot(i: int) -> list[Any]:
            return ["param", i] if i < n else ["temp", i - n] if i < t else ["extent", i - t]

        d: dict[str, Any] = {
            "name": self.name,
            "params": [{"name": a.name, "dtype": a.dtype, "shape": list(a.shape)} for a in self.args],
            "temps": [{"nbytes": t} for t in self.temps],
            "kernels": [{"name": ln.kernel, "args": [slot(i) for i in ln.args],
                         "grid": list(ln.grid), "block": list(ln.block),
                         **({"dyn_grid": list(ln.dyn_grid)} if ln.dyn_grid else {})} for ln in self.launches],
        }
        if self.extents:
            d["extents"] = [{"name": x.name, "dtype": x.dtype, "dims": [list(p) for p in x.dims]}
                            for x in self.extents]
        return d


@dataclass
class GPUPayload:
    """Decoded contents of a GPU module payload."""

    fmt: str
    data: bytes
    source: str = ""
    arch: str = ""
    functions: list[GPUFunction] = field(default_factory=list)


def _grid_function(grids: Sequence[Sequence[sym.Dim]]) -> Callable[[Mapping[str, int]], list[tuple[int, ...]]]:
    """The launcher's function of the extents giving each launch's grid (``grids``: per launch,
    per dim, a run-time grid expression or the static size); :meth:`GPUFunction.check`
    compiles each expression with it once, so a table that loads compiles."""
    return sym.shape_function(grids)


def payload_version(functions: Sequence[GPUFunction]) -> int:
    """The layout a function table needs: version 4 when a launch has a run-time grid, 3 when
    a function has runtime extents, else version 2 (each byte for byte what the Kilns that
    introduced it wrote, so a module needing no newer field stays readable by them)."""
    if any(e for f in functions for ln in f.launches for e in ln.dyn_grid):
        return GRID_PAYLOAD_VERSION
    return DYNAMIC_PAYLOAD_VERSION if any(f.extents for f in functions) else PAYLOAD_VERSION


def write_function_table(w: Writer, functions: Sequence[GPUFunction]) -> None:
    """Append the function table in the layout :func:`payload_version` gives (module docstring)."""
    version = payload_version(functions)
    w.u64(len(functions))
    for f in functions:
        w.string(f.name)
        w.u64(len(f.args))
        for a in f.args:
            w.u8(a.kind)
            w.string(a.name)
            w.string(a.dtype)
            w.u64(len(a.shape))
            for d in a.shape:
                w.i64(int(d))
        w.u64_vector([int(t) for t in f.temps])
        if version >= DYNAMIC_PAYLOAD_VERSION:
            w.u64(len(f.extents))
            for x in f.extents:
                w.string(x.name)
                w.string(x.dtype)
                w.u64(len(x.dims))
                for i, d in x.dims:
                    w.u32(int(i))
                    w.u32(int(d))
        w.u64(len(f.launches))
        for ln in f.launches:
            w.string(ln.kernel)
            for v in (*ln.grid, *ln.block, ln.shared_bytes):
                w.u32(int(v))
            w.u64(len(ln.args))
            for i in ln.args:
                w.u32(int(i))
            if version >= GRID_PAYLOAD_VERSION:
                if ln.dyn_grid and len(ln.dyn_grid) != 3:
                    raise KilnError(f"kernel {ln.kernel!r} of {f.name!r}: a run-time grid has 3 expressions, got "
                                    f"{list(ln.dyn_grid)}")
                for e in ln.dyn_grid or ("", "", ""):
                    w.string(e)


def read_function_table(r: Reader, arg_names: bool = True, version: int = PAYLOAD_VERSION) -> list[GPUFunction]:
    """Read what :func:`write_function_table` wrote (``arg_names=False``: the ``cuda`` v1 layout)."""
    funcs: list[GPUFunction] = []
    for _ in range(r.count("function count", 24)):
        name = r.string("function name")
        args = []
        for _ in range(r.count(f"argument count of {name!r}", 25 if arg_names else 17)):
            kind = r.u8("argument kind")
            if kind not in _ARG_KINDS:
                raise r.error(f"function {name!r}: unknown argument kind {kind}")
            aname = r.string("argument name") if arg_names else ""
            dtype = r.string("argument dtype")
            shape = tuple(r.i64("argument shape") for _ in range(r.count("argument ndim", 8)))
            args.append(GPUArg(kind, dtype, shape, aname))
        temps = tuple(r.u64_vector(f"temporaries of {name!r}"))
        extents = []
        if version >= DYNAMIC_PAYLOAD_VERSION:
            for _ in range(r.count(f"runtime extent count of {name!r}", 24)):
                xname = r.string("extent name")
                xdtype = r.string("extent dtype")
                xdims = tuple((r.u32("extent argument"), r.u32("extent dim"))
                              for _ in range(r.count("extent dim count", 8)))
                extents.append(GPUExtent(xname, xdtype, xdims))
        launches = []
        for _ in range(r.count(f"launch count of {name!r}", 44)):
            kernel = r.string("kernel name")
            dims = [r.u32("launch dims") for _ in range(7)]
            kargs = tuple(r.u32("kernel argument index") for _ in range(r.count("kernel argument count", 4)))
            dyn: tuple[str, ...] = ()
            if version >= GRID_PAYLOAD_VERSION:
                dyn = tuple(r.string("run-time grid") for _ in range(3))
                dyn = dyn if any(dyn) else ()
            launches.append(GPULaunch(kernel, tuple(dims[0:3]), tuple(dims[3:6]), dims[6], kargs, dyn))  # type: ignore[arg-type]
        f = GPUFunction(name, tuple(args), tuple(launches), temps, tuple(extents))
        f.check(f"{r.where} at offset {r.pos}")
        funcs.append(f)
    return funcs


# ==========================================================================================
# device APIs
# ==========================================================================================
class GPUDeviceAPI(DeviceAPI):
    """Base of device APIs whose memory the host cannot address (``host_visible`` is False).

    It sorts a copy into one of four kinds and hands it to :meth:`_copy`: ``"DtoD"`` (within
    one device), ``"peer"`` (between two devices of the type), ``"DtoH"`` (to host-visible
    memory) and ``"HtoD"`` (from it); any other pair is a :class:`DeviceError`.
    """

    host_visible = False
    #: The device type served.
    device_type: ClassVar[int]
    #: Its name in messages ("CUDA").
    device_label: ClassVar[str]

    def copy_data_from_to(self, src_ptr: int, src_offset: int, dst_ptr: int, dst_offset: int, nbytes: int,
                          src_dev: Device, dst_dev: Device, stream: Any = None) -> None:
        if not nbytes:
            return
        src_gpu, dst_gpu = src_dev.device_type == self.device_type, dst_dev.device_type == self.device_type
        if src_gpu and dst_gpu:
            kind = "DtoD" if src_dev.device_id == dst_dev.device_id else "peer"
        elif src_gpu and dst_dev.host_visible:
            kind = "DtoH"
        elif dst_gpu and src_dev.host_visible:
            kind = "HtoD"
        else:
            raise DeviceError(f"the {self.device_label} device API cannot copy between {src_dev} and {dst_dev}")
        self._copy(kind, (src_ptr, src_offset), (dst_ptr, dst_offset), int(nbytes), src_dev, dst_dev, stream)

    @abc.abstractmethod
    def _copy(self, kind: str, src: tuple[int, int], dst: tuple[int, int], nbytes: int, src_dev: Device,
              dst_dev: Device, stream: Any) -> None:
        """Copy ``nbytes`` (> 0) from ``src`` to ``dst`` (each ``(pointer or handle, byte offset)``)."""


# ==========================================================================================
# the module
# ==========================================================================================
class GPUModule(Module):
    """Base of device modules that hold a program and a :class:`GPUFunction` table.

    A backend subclass sets the class attributes and implements :meth:`_load`,
    :meth:`_kernel`, :meth:`_prepare`, :meth:`_run` and :meth:`_check_runtime`.

    Parameters
    ----------
    data : bytes or str
        What the driver loads (PTX text, a cubin image); may be empty where the driver
        compiles ``source`` instead.
    fmt : str
        Binary format, one of :attr:`binary_formats`.
    functions : sequence of GPUFunction
        The function table.
    source : str, optional
        Source code (what ``get_source`` shows; what the driver compiles when ``data`` is empty).
    arch : str, optional
        The architecture ``data`` was compiled for, informative.
    """

    #: DLPack device type of the arrays the functions take.
    device_type: ClassVar[int]
    #: Device name in messages ("CUDA", "OpenCL").
    device_label: ClassVar[str]
    #: First 8 bytes of the payload.
    payload_magic: ClassVar[bytes]
    #: Values ``fmt`` may take.
    binary_formats: ClassVar[tuple[str, ...]]
    #: What ``kiln inspect`` calls a binary format, where not its own name.
    format_names: ClassVar[Mapping[str, str]] = {}
    #: Older payload versions :meth:`_decode_legacy` reads.
    legacy_versions: ClassVar[tuple[int, ...]] = ()

    def __init__(self, data: bytes | str, fmt: str, functions: Sequence[GPUFunction], source: str = "",
                 arch: str = "") -> None:
        super().__init__()
        if fmt not in self.binary_formats:
            raise KilnError(f"{type(self).__name__}: fmt must be one of {list(self.binary_formats)}, got {fmt!r}")
        self.data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self.fmt = fmt
        self.source = source
        self.arch = arch
        self.functions: dict[str, GPUFunction] = {f.name: f for f in functions}
        self._programs: dict[int, Any] = {}  # device id -> what _load returned
        self._launchers: dict[str, _Launcher] = {}
        self._lock = threading.Lock()
        self._runtime_ok = False  # require_runtime passed once: the driver stays loaded

    # ---- backend hooks ---------------------------------------------------------------------
    def _load(self, device_id: int) -> Any:
        """Load / build the program on a device (called once per device, under a lock)."""
        raise NotImplementedError

    def _kernel(self, program: Any, device_id: int, launch: GPULaunch) -> Any:
        """The driver's handle of ``launch.kernel`` in ``program``."""
        raise NotImplementedError

    def _prepare(self, device_id: int, func: GPUFunction, kernels: list[Any], values: list[Any]) -> Any:
        """A launch plan for ``func`` whose arguments then temporaries are ``values``.

        A tensor (or temporary) value is ``(buffer handle, byte offset)``; a scalar is a
        ctypes value of its dtype. The plan must keep alive whatever it points into.
        ``func.launches`` are the launches as made (one per entry of ``kernels``): a run-time
        grid is already evaluated into ``grid`` and a launch with an empty grid left out.
        """
        raise NotImplementedError

    def _run(self, device_id: int, func: GPUFunction, plan: Any) -> None:
        """Launch the plan's kernels in order; raise :class:`KernelError` naming a failed one."""
        raise NotImplementedError

    @classmethod
    def _check_runtime(cls) -> None:
        """Raise :class:`DeviceError` (saying what to install) unless a device can run modules."""
        raise NotImplementedError

    @classmethod
    def _decode_legacy(cls, r: Reader, version: int) -> GPUPayload:
        """Read the rest of an older payload (``version`` in :attr:`legacy_versions`)."""
        raise NotImplementedError

    # ---- functions -------------------------------------------------------------------------
    @property
    def function_names(self) -> list[str]:
        """Names of the functions this module defines."""
        return list(self.functions)

    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        la = self._launchers.get(name)
        if la is None:
            f = self.functions.get(name)
            if f is None:
                return None
            la = self._launchers.setdefault(name, _Launcher(self, f))
        return la

    def program(self, device_id: int) -> Any:
        """The program loaded on device ``device_id`` (loaded on first use)."""
        p = self._programs.get(device_id)
        if p is None:
            with self._lock:
                p = self._programs.get(device_id)
                if p is None:
                    self.require_runtime()
                    p = self._load(device_id)
                    self._programs[device_id] = p
        return p

    # ---- serialization ---------------------------------------------------------------------
    def save_to_binary(self) -> bytes:
        return self.encode_payload(GPUPayload(self.fmt, self.data, self.source, self.arch,
                                              list(self.functions.values())))

    @classmethod
    def encode_payload(cls, p: GPUPayload) -> bytes:
        """Serialize a payload in the version-2 layout, version 3 when a function has runtime
        extents, 4 when a launch has a run-time grid (module docstring)."""
        if p.fmt not in cls.binary_formats:
            raise KilnError(f"{cls.type_key} module: binary format must be one of {list(cls.binary_formats)}, "
                            f"got {p.fmt!r}")
        w = Writer()
        w.raw(cls.payload_magic)
        w.u32(payload_version(p.functions))
        w.string(p.fmt)
        w.string(p.arch)
        w.sized_bytes(p.data)
        w.string(p.source)
        write_function_table(w, p.functions)
        return w.getvalue()

    @classmethod
    def decode_payload(cls, data: bytes | memoryview, where: str = "") -> GPUPayload:
        """Parse a payload (pure parsing; needs no driver).

        Raises
        ------
        FormatError
            On a bad magic, an unknown version or a truncated/corrupt payload (with the offset).
        """
        where = where or f"{cls.type_key} module payload"
        r = Reader(data, where)
        magic = r.raw(len(cls.payload_magic), "magic")
        if magic != cls.payload_magic:
            raise FormatError(f"{where}: not a Kiln {cls.type_key} module payload (magic {magic!r}, "
                              f"expected {cls.payload_magic!r})")
        version = r.u32("version")
        if version in cls.legacy_versions:
            p = cls._decode_legacy(r, version)
        elif version in (PAYLOAD_VERSION, DYNAMIC_PAYLOAD_VERSION, GRID_PAYLOAD_VERSION):
            p = cls._read_body(r, version=version)
        else:
            known = sorted({*cls.legacy_versions, PAYLOAD_VERSION, DYNAMIC_PAYLOAD_VERSION, GRID_PAYLOAD_VERSION})
            raise FormatError(f"{where}: {cls.type_key} module payload version {version} is not supported (this "
                              f"Kiln reads versions {known}); rebuild the library with this Kiln")
        r.expect_end("the function table")
        return p

    @classmethod
    def _read_body(cls, r: Reader, arg_names: bool = True, version: int = PAYLOAD_VERSION) -> GPUPayload:
        """The fields after the version (``arg_names=False``: the ``cuda`` version-1 table)."""
        fmt = r.string("binary format")
        if fmt not in cls.binary_formats:
            raise r.error(f"binary format must be one of {list(cls.binary_formats)}, got {fmt!r}")
        arch = r.string("arch")
        binary = r.sized_bytes("binary")
        source = r.string("source")
        return GPUPayload(fmt, binary, source, arch, read_function_table(r, arg_names, version))

    @classmethod
    def describe_payload(cls, data: bytes | memoryview) -> dict[str, Any]:
        """Summarize a payload for ``kiln inspect`` (no driver, no library code).

        Returns
        -------
        dict
            ``format``, ``arch``, ``binary_bytes`` (when there is a binary), ``source_bytes``,
            ``functions`` (name, argument/launch counts, temporary bytes) and ``kernels``
            (name, grid, block, shared bytes, run-time grid where there is one; once per kernel).
        """
        p = cls.decode_payload(data)
        kernels: dict[str, dict[str, Any]] = {}
        for f in p.functions:
            for ln in f.launches:
                kernels.setdefault(ln.kernel, {"name": ln.kernel, "grid": list(ln.grid), "block": list(ln.block),
                                               "shared_bytes": ln.shared_bytes,
                                               **({"dyn_grid": list(ln.dyn_grid)} if ln.dyn_grid else {})})
        out: dict[str, Any] = {"format": cls.format_names.get(p.fmt, p.fmt), "arch": p.arch}
        if p.data:
            out["binary_bytes"] = len(p.data)
        out["source_bytes"] = len(p.source.encode("utf-8"))
        out["functions"] = [{"name": f.name, "num_args": len(f.args), "launches": len(f.launches),
                             "temp_bytes": sum(f.temps), **({"extents": [x.name for x in f.extents]}
                                                            if f.extents else {})} for f in p.functions]
        out["kernels"] = list(kernels.values())
        return out

    @classmethod
    def from_payload(cls, p: GPUPayload) -> "GPUModule":
        """The module a decoded payload describes."""
        return cls(p.data, p.fmt, p.functions, p.source, p.arch)

    @classmethod
    def load_binary(cls, payload: bytes) -> "GPUModule":
        """The ``loadbinary_<type_key>`` loader: parse the payload. Needs no driver.

        A library holding device code therefore loads (and can be inspected, and its CPU
        functions run) on a machine without the device runtime; the runtime is needed only
        when an executor is created on the device or a function runs there
        (:meth:`require_runtime`).

        Raises
        ------
        FormatError
            On a malformed payload.
        """
        return cls.from_payload(cls.decode_payload(payload))

    def require_runtime(self) -> None:
        """Raise unless this module's device runtime (driver + a device) is usable here.

        Raises
        ------
        DeviceError
            Naming the module's functions and what to install.
        """
        if self._runtime_ok:
            return
        try:
            type(self)._check_runtime()
        except DeviceError as err:
            names = list(self.functions)
            what = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            article = "an" if self.type_key[:1] in "aeiou" else "a"
            raise DeviceError(f"cannot run {article} {self.type_key} device module (kernels: {what}): {err}") from None
        self._runtime_ok = True

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.fmt}, {len(self.data)} bytes, {len(self.source)} source chars, "
                f"arch={self.arch or '?'}, functions={sorted(self.functions)})")


class _Launcher:
    """The packed function that checks its arguments and launches one function's kernels.

    ``launcher(*args, shapes=None)``: ``shapes`` gives, per argument, the actual shape of a
    tensor stored at its upper-bound shape (a sequence of ints, or None for the full
    shape); a function with runtime extents reads them from there. Without ``shapes`` the
    extents are the upper bounds (the whole storage is valid data).
    """

    def __init__(self, module: GPUModule, func: GPUFunction) -> None:
        self.module = module
        self.func = func
        self.name = func.name
        #: whether calls should pass ``shapes=`` (the graph executor does, for dynamic graphs)
        self.takes_shapes = bool(func.extents)
        self._kernels: dict[int, list[Any]] = {}  # device id -> kernel handle per launch
        self._temps: dict[int, list[tuple[int, int]]] = {}  # device id -> (buffer, 0) per temporary
        self._temp_allocs: list[tuple[Device, int]] = []
        # (device id, argument values) -> plan of the previous call
        self._last: tuple[tuple[Any, ...], Any] | None = None
        #: the grid of each launch in the current plan (``(0, 0, 0)`` for one left out)
        self.grids: tuple[tuple[int, int, int], ...] = tuple(ln.grid for ln in func.launches)
        # run-time grids: one compiled function of the extents gives every launch's grid
        self._grid_fn: Callable[..., Any] | None = None
        if any(ln.dyn_grid for ln in func.launches):
            self._grid_fn = _grid_function(
                [[e or g for e, g in zip(ln.dyn_grid, ln.grid)] if ln.dyn_grid else ln.grid for ln in func.launches])

    def _temp_values(self, device_id: int) -> list[tuple[int, int]]:
        ts = self._temps.get(device_id)
        if ts is None:
            dev = Device(self.module.device_type, device_id)
            api = get_device_api(dev)
            ts = []
            for n in self.func.temps:
                ptr = api.alloc_data_space(dev, max(int(n), 1), ALLOC_ALIGNMENT)
                self._temp_allocs.append((dev, ptr))
                ts.append((ptr, 0))
            self._temps[device_id] = ts
        return ts

    def __del__(self) -> None:
        for dev, ptr in getattr(self, "_temp_allocs", ()):
            try:
                get_device_api(dev).free_data_space(dev, ptr)
            except Exception:  # noqa: BLE001 - never raise from a finalizer (e.g. at shutdown)
                pass

    def _bad_arg(self, i: int, a: Any, device_id: int | None) -> InputError:
        m, spec = self.module, self.func.args[i]
        what = f"{m.type_key} function {self.name!r}: argument {i}" + (f" ({spec.name})" if spec.name else "")
        dev = getattr(a, "device", None)
        if not isinstance(dev, Device) or not hasattr(a, "handle"):
            return InputError(f"{what} must be an NDArray on {'an' if m.device_label[0] in 'AEIOU' else 'a'} "
                              f"{m.device_label} device, got {type(a).__name__}")
        if dev.device_type != m.device_type:
            return InputError(f"{what} is on {dev}, expected {Device(m.device_type, dev.device_id)}")
        if device_id is not None and dev.device_id != device_id:
            return InputError(f"{what} is on {dev}, but the first tensor argument is on "
                              f"{Device(m.device_type, device_id)}")
        return InputError(f"{what} is {a.dtype}{list(a.shape)}, expected {spec.dtype}{list(spec.shape)}")

    def _dim_label(self, i: int, d: int) -> str:
        """``argument i (name) dim d`` for error messages (built only when one is raised)."""
        return f"argument {i}" + (f" ({self.func.args[i].name})" if self.func.args[i].name else "") + f" dim {d}"

    def _extent_values(self, shapes: Sequence[Any] | None) -> tuple[int, ...]:
        """Each runtime extent from the first dim that has it, checked against its upper bound
        and against the other dims that have it."""
        f, out = self.func, []
        for x in f.extents:
            value: int | None = None
            first = (0, 0)
            for i, d in x.dims:
                shp = shapes[i] if shapes is not None and i < len(shapes) else None
                hi = f.args[i].shape[d]
                v = hi if shp is None else int(shp[d])
                if not 0 <= v <= hi:
                    raise InputError(f"{self.module.type_key} function {self.name!r}: {self._dim_label(i, d)} "
                                     f"(the dynamic extent {x.name}) is {v}, expected 0..{hi}")
                if value is None:
                    value, first = v, (i, d)
                elif v != value:
                    raise InputError(f"{self.module.type_key} function {self.name!r}: {self._dim_label(i, d)} is {v} "
                                     f"but argument {first[0]} dim {first[1]} is {value}; both are the dynamic "
                                     f"extent {x.name}")
            out.append(value if value is not None else 0)
        return tuple(out)

    def _launches(self, extents: tuple[int, ...]) -> list[tuple[int, GPULaunch]]:
        """``(index, launch)`` of each launch to make at these extents, with its actual grid:
        a run-time grid clamped to ``[0, grid]``; a launch with an empty grid is left out."""
        f = self.func
        if self._grid_fn is None:
            return list(enumerate(f.launches))
        values = self._grid_fn({x.name: v for x, v in zip(f.extents, extents)})
        out: list[tuple[int, GPULaunch]] = []
        grids: list[tuple[int, int, int]] = []
        for i, (ln, g) in enumerate(zip(f.launches, values)):
            gx, gy, gz = (min(hi, max(0, int(v))) for v, hi in zip(g, ln.grid))
            grid = (gx, gy, gz)
            if 0 in grid:
                grids.append((0, 0, 0))
                continue
            grids.append(grid)
            out.append((i, ln if grid == ln.grid else dataclasses.replace(ln, grid=grid)))
        self.grids = tuple(grids)
        return out

    def _prepare(self, device_id: int, values: tuple[Any, ...], extents: tuple[int, ...] = ()) -> Any:
        m, f = self.module, self.func
        kernels = self._kernels.get(device_id)
        if kernels is None:
            program = m.program(device_id)
            kernels = self._kernels[device_id] = [m._kernel(program, device_id, ln) for ln in f.launches]
        made = self._launches(extents)
        if len(made) != len(f.launches) or any(ln is not f.launches[i] for i, ln in made):
            kernels = [kernels[i] for i, _ in made]
            f = dataclasses.replace(f, launches=tuple(ln for _, ln in made))
        vals: list[Any] = []
        for spec, v in zip(f.args, values):
            if spec.kind == ARG_TENSOR:
                vals.append(v)
            else:
                ct = SCALAR_CTYPES.get(spec.dtype)
                if ct is None:
                    raise KilnError(f"{m.type_key} function {f.name!r}: unsupported scalar dtype {spec.dtype!r}")
                vals.append(ct(v))
        vals.extend(self._temp_values(device_id) if f.temps else ())
        vals.extend(SCALAR_CTYPES[x.dtype](v) for x, v in zip(f.extents, extents))
        return m._prepare(device_id, f, kernels, vals)

    def __call__(self, *args: Any, shapes: Sequence[Any] | None = None) -> None:
        specs, dt = self.func.args, self.module.device_type
        if len(args) != len(specs):
            names = ", ".join(s.name for s in specs if s.name)
            raise InputError(f"{self.module.type_key} function {self.name!r} takes {len(specs)} arguments"
                             + (f" ({names})" if names else "") + f", got {len(args)}")
        key: list[Any] = []
        device_id: int | None = None
        for i, a in enumerate(args):
            spec = specs[i]
            if spec.kind == ARG_TENSOR:
                # NDArray's slots read directly: this runs on every kernel call of the executor.
                try:
                    dev, h = a._device, a.handle
                    ok = dev.device_type == dt and a._dtype == spec.dtype and a._shape == spec.shape
                except AttributeError:
                    ok = False
                if not ok or (device_id is not None and dev.device_id != device_id):
                    raise self._bad_arg(i, a, device_id)
                device_id = dev.device_id
                key.append((h.data or 0, h.byte_offset))
            else:
                key.append(a)
        device_id = device_id or 0
        extents = self._extent_values(shapes) if self.func.extents else ()
        k = (device_id, *key, *extents)
        last = self._last
        if last is None or last[0] != k:
            last = self._last = (k, self._prepare(device_id, tuple(key), extents))
        self.module._run(device_id, self.func, last[1])

    def __repr__(self) -> str:
        return f"<{self.module.type_key} function {self.name} ({len(self.func.launches)} launches)>"
