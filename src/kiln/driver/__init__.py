"""The compile driver: passes -> fusion -> lowering -> codegen -> graph JSON -> factory.

Public API
----------
- :func:`build` (also ``kiln.build``): graph -> :class:`~kiln.runtime.ExecutorFactoryModule`.
- :func:`lower`: optimize + fuse + lower without codegen; ``print(lower(mod))`` shows the
  fused groups and every kernel's loop IR.
- :func:`fuse`: optimize + fuse only.
- :func:`optimize`: the graph pass pipeline.
- :func:`build_portable` (also ``kiln.build_portable``): one build per CPU feature level, chosen
  at load (:class:`~kiln.runtime.IsaDispatchModule`).
- :func:`load_linked_params`: read the weights a ``link_params=True`` library carries.

See ``docs/compiler.md``.
"""

from __future__ import annotations

from .build import BuildStats, build, fuse, lower, optimize
from .linked_params import LOOKUP_FUNC, load_linked_params, linked_params_module
from .portable import build_portable

__all__ = ["build", "build_portable", "lower", "fuse", "optimize", "BuildStats", "load_linked_params",
           "linked_params_module", "LOOKUP_FUNC"]
