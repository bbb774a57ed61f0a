"""Neural-network computes: convolution, dense/matmul, pooling, normalisation, softmax."""

from __future__ import annotations

from .conv2d import conv2d_nchw, conv2d_transpose_nchw
from .dense import dense, matmul
from .norm import softmax
from .pool import pool2d
from . import winograd  # noqa: F401  (registers the Winograd F(2x2,3x3) transform computes)

__all__ = ["conv2d_nchw", "conv2d_transpose_nchw", "dense", "matmul", "softmax", "pool2d"]
