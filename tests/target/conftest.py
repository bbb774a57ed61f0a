"""Private compile cache for target tests (they compile one small module)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_kiln_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache_target")))
    yield
    mp.undo()
