"""Shared fixtures: a private compile cache for the codegen tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_kiln_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A fresh cache per session: tests must not depend on (or pollute) ~/.cache/kiln.
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()
