"""Import a script of the repository's ``tools/`` or ``bench/`` folders (not packages) by its path.

Tests that check a script's output load it here instead of editing ``sys.path``, which would
leak the folder into every later import of the session.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_repo_script(relpath: str) -> ModuleType | None:
    """The module at ``REPO_ROOT/relpath`` (e.g. ``"tools/make_demo_model.py"``), or None if absent.

    It is registered in ``sys.modules`` as ``kiln_script_<stem>`` before it runs (dataclasses and
    pickling look a module up there) and loaded once per session.
    """
    path = os.path.join(REPO_ROOT, relpath)
    if not os.path.isfile(path):
        return None
    name = "kiln_script_" + os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a failed import (e.g. a missing optional dependency) leaves no half module
        raise
    return module
