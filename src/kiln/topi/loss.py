"""Computes and schedules: losses and normalizations.

Empty for now: the loss and normalization ops decompose into existing IR ops in the ONNX
frontend (``kiln/frontend/onnx/ops_loss.py``), whose kernels ``tests/topi/test_loss.py``
checks in the configurations the decompositions use.
"""

from __future__ import annotations
