"""``kiln.contrib.tar``: Kiln's hardened tar archives, under their TVM-style name.

The code lives in :mod:`kiln.runtime.tar` because the runtime itself reads archives at deploy
time (``load_module("model.tar")``); this module keeps ``kiln.contrib.tar.tar`` (an
``fcompile`` for ``.tar`` outputs), ``untar`` and friends working.
"""

from __future__ import annotations

from ..runtime.tar import (DEFAULT_MAX_BYTES, DEFAULT_MAX_MEMBERS, SafeArchive, looks_like_tar, open_archive, tar,
                           untar)

__all__ = ["tar", "untar", "open_archive", "looks_like_tar", "SafeArchive", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_MEMBERS"]
