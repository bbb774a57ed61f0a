"""A child-process prelude that makes chosen packages unimportable (deploy-only checks)."""

from __future__ import annotations

import textwrap

#: What a deployment machine lacks: the compiler side of Kiln and its third-party packages.
COMPILER_SIDE = [
    "onnx", "llvmlite", "onnxruntime", "kiln.ir", "kiln.frontend", "kiln.transform", "kiln.te",
    "kiln.tir", "kiln.topi", "kiln.codegen", "kiln.target", "kiln.driver",
]


def blocker_prelude(blocked: list[str]) -> str:
    """Python source that installs an import hook raising ImportError for ``blocked`` (and their
    submodules) and defines ``BLOCKED``; put it first in a ``python -c`` script."""
    return textwrap.dedent(
        f"""
        import sys
        BLOCKED = {blocked!r}

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"{{name}} is blocked for this test")
                return None

        sys.meta_path.insert(0, Blocker())
        """
    )
