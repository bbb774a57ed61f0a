"""IR ops: losses and normalizations.

SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss, Hardmax, LpNormalization,
MeanVarianceNormalization and GroupNormalization need no ops of their own: the ONNX frontend
(``kiln/frontend/onnx/ops_loss.py``) decomposes them into existing IR ops. This module is where
a dedicated op would be registered if a fused kernel ever beats those decompositions.
"""

from __future__ import annotations
