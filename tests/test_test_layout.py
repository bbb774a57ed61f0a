"""Rules of the test suite itself: a package layout, no ``sys.path`` edits, stable seeds, a private cache.

Each rule once failed: test folders were loose directories whose same-named ``conftest.py``
files clashed when collected together, tests edited ``sys.path`` to import each other, a seed
came from ``hash()`` (which changes with ``PYTHONHASHSEED``), and builds wrote into the user's
``~/.cache/kiln``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def _test_sources() -> list[str]:
    out = []
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        out += [os.path.join(root, f) for f in files if f.endswith(".py")]
    return sorted(out)


def test_every_test_folder_is_a_package() -> None:
    # folders of test modules or fixtures; data folders (fuzz corpora and their generators) need none
    missing = [os.path.relpath(root, REPO) for root, dirs, files in os.walk(TESTS)
               if any(f.startswith("test_") and f.endswith(".py") or f == "conftest.py" for f in files)
               and "__init__.py" not in files]
    # test modules import shared helpers as tests.<folder>.<module>
    assert missing == [], "add an __init__.py to these folders"


def test_no_sys_path_edits_and_no_hash_seeds() -> None:
    this = os.path.abspath(__file__)
    bad = []
    for path in _test_sources():
        if path == this:
            continue
        with open(path, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                code = line.split("#", 1)[0]
                if re.search(r"sys\.path\.(insert|append)\(", code):
                    bad.append(f"{os.path.relpath(path, REPO)}:{no}: edits sys.path (import tests.<folder>.<module>)")
                if re.search(r"(default_rng|seed|RandomState)\(.*\bhash\(", code):
                    bad.append(f"{os.path.relpath(path, REPO)}:{no}: seed from hash() (use zlib.crc32)")
    assert bad == []


def test_session_uses_a_private_kiln_cache() -> None:
    cache = os.environ.get("KILN_CACHE_DIR")
    assert cache, "tests/conftest.py must set KILN_CACHE_DIR for the session"
    default = os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    assert os.path.abspath(cache) != os.path.abspath(default)
    if not os.environ.get("KILN_TEST_CACHE_DIR"):
        assert os.path.basename(cache).startswith("kiln-test-cache-"), cache


def test_folders_with_conftests_collect_together() -> None:
    """``pytest tests/topi tests/codegen`` (that order) once failed: the second folder's test modules
    found the first folder's ``conftest`` (or a same-named module) in ``sys.modules``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
           "tests/topi", "tests/codegen", "tests/executor"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", proc.stdout, re.M), proc.stdout[-3000:]
