"""Kiln runtime: everything needed to load and run a compiled model.

Imports only NumPy and the standard library. Names are resolved lazily so that importing
``kiln.runtime`` has no side effects and stays cheap; see ``_LAZY`` for where each public
name lives.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .errors import *  # noqa: F401,F403  (the exception hierarchy is part of this namespace)

_LAZY: dict[str, str | None] = {
    # arrays and devices
    "NDArray": "ndarray",
    "ndarray": "ndarray",
    "Device": "device",
    "DeviceAPI": "device",
    "register_device_api": "device",
    "get_device_api": "device",
    "cpu": "device",
    "cuda": "device",
    "opencl": "device",
    # modules
    "Module": "module",
    "PackedFunction": "module",
    "register_loader": "module",
    "list_loaders": "module",
    "load_module": "module",
    "register_func": "registry",
    "get_global_func": "registry",
    "list_global_func_names": "registry",
    "BenchmarkResult": "benchmark",
    "csource_module": "csource",
    "CSourceModule": "csource",
    "LibraryModule": "library_module",
    # params
    "save_param_dict": "params",
    "load_param_dict": "params",
    "save_param_dict_to_file": "params",
    "load_param_dict_from_file": "params",
    # executors
    "GraphModule": "graph_executor",
    "graph_executor": None,
    "debug_executor": None,
    "ExecutorFactoryModule": "executor_factory",
    "executor_factory": None,
    "IsaDispatchModule": "isa_dispatch",
    "isa_dispatch": None,
    "model_api": None,
}


def include_path() -> str:
    """Directory holding ``kiln/c_runtime_api.h``, the header every kernel library includes.

    Returns
    -------
    str
        Absolute path to put on the C compiler's include path (``-I``).
    """
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def crt_source_path() -> str:
    """Path of ``kiln_crt.c``, the small C runtime compiled into every Kiln library."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "crt", "kiln_crt.c")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kiln.runtime' has no attribute {name!r}")
    sub = _LAZY[name]
    if sub is None:
        return importlib.import_module(f".{name}", __name__)
    mod = importlib.import_module(f".{sub}", __name__)
    return mod if sub == name else getattr(mod, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# ``kiln.runtime.device`` is the function ``device(name_or_type, id)`` (as ``kiln.device``),
# not the submodule of the same name: importing the submodule makes Python set the package
# attribute to the module, so it is imported here (stdlib + NumPy only, no registrations
# beyond the CPU device) and the attribute rebound once.
from . import device as _device_module  # noqa: E402

device = _device_module.device
