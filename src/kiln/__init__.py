"""Kiln: a deep-learning compiler and deployment runtime.

``import kiln`` is cheap and pulls in no compiler dependency: runtime names resolve from
:mod:`kiln.runtime`, compiler names (``build``, ``frontend``, ``target`` ...) load on first
use. A machine that only deploys models needs NumPy alone.
"""

from __future__ import annotations

import importlib
from typing import Any

from .runtime.errors import KilnError as KilnError  # re-exported: kiln.KilnError

from ._version import __version__ as __version__  # re-exported: kiln.__version__

# name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "runtime": ("kiln.runtime", None),
    "nd": ("kiln.nd", None),
    "device": ("kiln.runtime.device", "device"),
    "cpu": ("kiln.runtime.device", "cpu"),
    "cuda": ("kiln.runtime.device", "cuda"),
    "opencl": ("kiln.runtime.device", "opencl"),
    "Device": ("kiln.runtime.device", "Device"),
    "GraphModule": ("kiln.runtime.graph_executor", "GraphModule"),
    "load_module": ("kiln.runtime.module", "load_module"),
    # compiler side
    "ir": ("kiln.ir", None),
    "frontend": ("kiln.frontend", None),
    "transform": ("kiln.transform", None),
    "te": ("kiln.te", None),
    "tir": ("kiln.tir", None),
    "topi": ("kiln.topi", None),
    "target": ("kiln.target", None),
    "codegen": ("kiln.codegen", None),
    "build": ("kiln.driver.build", "build"),
    "build_portable": ("kiln.driver.portable", "build_portable"),
    "driver": ("kiln.driver", None),
    "autotune": ("kiln.autotune", None),
    "contrib": ("kiln.contrib", None),
    # tools: ``kiln.cli.main([...])`` runs the ``kiln`` command in-process
    "cli": ("kiln.cli", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    modname, attr = _LAZY[name]
    mod = importlib.import_module(modname)
    return mod if attr is None else getattr(mod, attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
