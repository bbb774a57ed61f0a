"""Helpers shared by the torch frontend tests (and the tests of passes that use torch models)."""

from __future__ import annotations

import sys
from typing import Any

import pytest


def transformers_or_skip() -> Any:
    """``transformers``, or a skip; importable even where the installed torchvision is broken.

    transformers imports torchvision when it is installed, and a torchvision built for another
    torch fails at import ("operator torchvision::nms does not exist"), taking every model
    class with it. These text/vision-transformer models need no torchvision, so a broken one
    is marked absent.
    """
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means it is unusable
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules["torchvision"] = None  # type: ignore[assignment]
    return pytest.importorskip("transformers")


def randomize_bn(m: Any) -> None:
    """Give every BatchNorm of ``m`` non-trivial running statistics (fresh ones are 0 / 1)."""
    import torch  # torch is optional: only the tests that already have it call this

    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.uniform_(-0.3, 0.3)
                mod.running_var.uniform_(0.5, 1.5)
