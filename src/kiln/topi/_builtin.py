"""Importing this module registers every built-in compute and schedule."""

from __future__ import annotations

from . import broadcast, elemwise, reduce, resize, transform  # noqa: F401
from . import attention, index, integer, loss, recurrent, spatial  # noqa: F401
from . import data_dependent  # noqa: F401  (loop-IR kernels: nonzero, unique, NMS, ...)
from . import ml  # noqa: F401  (loop-IR kernels over constant tables: ngram_count, tree_ensemble)
from .nn import conv2d, dense, norm, pool  # noqa: F401
from .nn import conv2d_nchwc  # noqa: F401
from .schedule import generic, x86  # noqa: F401
from .schedule import x86_conv, x86_softmax  # noqa: F401
