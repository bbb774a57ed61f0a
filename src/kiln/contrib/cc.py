"""``kiln.contrib.cc``: the system C compiler driver, under its TVM-style name.

The code lives in :mod:`kiln.runtime.cc` because the runtime itself needs it at deploy time
(a ``.tar`` library is compiled on the machine that loads it); this module keeps
``kiln.contrib.cc.create_shared`` / ``cross_compiler`` working for users and ``fcompile=``.
"""

from __future__ import annotations

from ..runtime.cc import DEFAULT_OPTIONS, create_shared, create_staticlib, cross_compiler, get_cc

__all__ = ["get_cc", "create_shared", "create_staticlib", "cross_compiler", "DEFAULT_OPTIONS"]
