"""Settings for the whole test session: a private Kiln cache.

Every build in a test run (in process or in a ``kiln`` subprocess, which inherits the
environment) writes its compiled kernels under ``$KILN_CACHE_DIR``. The session points it at a
fresh temporary directory, set in :func:`pytest_configure`, i.e. before any test module is
imported, so a run neither reads stale entries from nor pollutes the user's ``~/.cache/kiln``
(and the outcome cannot depend on what an earlier run left there). The directory is removed
at the end of the session.

``KILN_TEST_CACHE_DIR=/some/dir`` reuses that directory instead (kept afterwards): repeated
local runs then skip recompiling unchanged kernels.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

TEST_CACHE_ENV = "KILN_TEST_CACHE_DIR"
_CREATED_KEY = pytest.StashKey[str]()
_PREVIOUS_KEY = pytest.StashKey["str | None"]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_PREVIOUS_KEY] = os.environ.get("KILN_CACHE_DIR")
    reuse = os.environ.get(TEST_CACHE_ENV)
    if reuse:
        os.makedirs(reuse, exist_ok=True)
        os.environ["KILN_CACHE_DIR"] = os.path.abspath(reuse)
        return
    created = tempfile.mkdtemp(prefix="kiln-test-cache-")
    config.stash[_CREATED_KEY] = created
    os.environ["KILN_CACHE_DIR"] = created


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(_PREVIOUS_KEY, None)
    if previous is None:
        os.environ.pop("KILN_CACHE_DIR", None)
    else:  # pytest run in-process (pytester, an IDE): give the caller its environment back
        os.environ["KILN_CACHE_DIR"] = previous
    created = config.stash.get(_CREATED_KEY, None)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    return f"kiln cache: {os.environ.get('KILN_CACHE_DIR')} (set {TEST_CACHE_ENV} to reuse one)"
