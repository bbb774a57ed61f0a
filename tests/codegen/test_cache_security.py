"""The compile cache cannot be poisoned by others, and stays under its size cap."""

from __future__ import annotations

import hashlib
import logging
import os
import stat

import pytest

from kiln.codegen import cache


def _writer(content: bytes):
    def produce(path: str) -> None:
        with open(path, "wb") as f:
            f.write(content)

    return produce


def _entries(root) -> list[str]:
    return sorted(p for p in (str(x) for x in root.rglob("*")) if p.endswith(".so"))


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.delenv("KILN_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    cache.reset_stats()
    return root


def test_new_cache_dir_and_key_are_private(private_cache):
    cache.cached_file(cache.make_key("a"), "so", _writer(b"A"))
    assert stat.S_IMODE(private_cache.stat().st_mode) == 0o700
    key = private_cache / cache.KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32


def test_first_use_from_many_threads_sees_one_whole_key(private_cache):
    """Threads (a build's background compiles) that meet a new cache at once all read the same
    32-byte key: none sees a half-written file and falls back to compiling without the cache."""
    import threading

    private_cache.mkdir(mode=0o700)
    start = threading.Barrier(8)
    keys: list[bytes | None] = []

    def use() -> None:
        start.wait()
        keys.append(cache._hmac_key(str(private_cache)))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and keys[0] is not None and len(keys[0]) == 32 and set(keys) == {keys[0]}
    assert (private_cache / cache.KEY_FILE).read_bytes() == keys[0]
    assert sorted(p.name for p in private_cache.iterdir()) == [cache.KEY_FILE]  # no temporaries left


def test_entry_planted_by_someone_else_is_not_loaded(private_cache):
    key = cache.make_key("kernel source")
    path = cache.cached_file(key, "so", _writer(b"GENUINE"))
    hits = cache.stats["hits"]
    # An attacker swaps the entry and writes the checksums they can compute (no HMAC key):
    evil = b"EVIL CODE"
    with open(path, "wb") as f:
        f.write(evil)
    for side in (".sha256", ".mac"):
        with open(path + side, "w") as f:
            f.write(hashlib.sha256(evil).hexdigest() + "\n")
    again = cache.cached_file(key, "so", _writer(b"GENUINE"))
    assert again == path and cache.stats["hits"] == hits  # a miss: rebuilt, not served
    with open(again, "rb") as f:
        assert f.read() == b"GENUINE"


def test_group_writable_cache_dir_is_refused(private_cache, caplog):
    private_cache.mkdir(mode=0o700)
    os.chmod(private_cache, 0o770)
    with caplog.at_level(logging.WARNING, logger="kiln.codegen.cache"):
        path = cache.cached_file(cache.make_key("b"), "so", _writer(b"B"))
    assert not path.startswith(str(private_cache))  # built privately instead
    assert _entries(private_cache) == [] and not (private_cache / cache.KEY_FILE).exists()
    assert "writable by group or others" in caplog.text


def test_cache_dir_owned_by_another_user_is_refused(private_cache, monkeypatch, caplog):
    private_cache.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(private_cache).st_uid + 1)
    with caplog.at_level(logging.WARNING, logger="kiln.codegen.cache"):
        path = cache.cached_file(cache.make_key("c"), "so", _writer(b"C"))
    assert not path.startswith(str(private_cache)) and _entries(private_cache) == []
    assert "not by the current user" in caplog.text


def test_readable_key_file_is_refused(private_cache, caplog):
    cache.cached_file(cache.make_key("d"), "so", _writer(b"D"))
    os.chmod(private_cache / cache.KEY_FILE, 0o644)
    with caplog.at_level(logging.WARNING, logger="kiln.codegen.cache"):
        path = cache.cached_file(cache.make_key("e"), "so", _writer(b"E"))
    assert not path.startswith(str(private_cache))
    assert "readable by group or others" in caplog.text


def test_eviction_keeps_the_cache_under_its_cap(private_cache, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "4000")
    keys = [cache.make_key(f"k{i}") for i in range(5)]  # 1000 bytes + a 65-byte MAC each: 3 fit
    paths = []
    for i, k in enumerate(keys):
        paths.append(cache.cached_file(k, "so", _writer(bytes([i]) * 1000)))
        os.utime(paths[-1], (1_000_000 + i, 1_000_000 + i))  # distinct, increasing "last use"
        if i == 2:  # a hit refreshes entry 0: it must outlive entries 1 and 2
            assert cache.cached_file(keys[0], "so", _writer(b"\0" * 1000)) == paths[0]
            os.utime(paths[0], (1_000_000 + 2.5, 1_000_000 + 2.5))
    total = sum(f.stat().st_size for f in private_cache.rglob("*") if f.is_file() and f.parent != private_cache)
    assert total <= 4000
    alive = [os.path.exists(p) for p in paths]
    assert alive == [True, False, False, True, True]  # least recently used went first
    for p, ok in zip(paths, alive):
        assert os.path.exists(p + ".mac") == ok  # no orphan MACs


def test_stores_do_not_rescan_the_cache_each_time(private_cache, monkeypatch):
    # A scan stats every entry; scanning per store made a build of N kernels O(N * cache size).
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "1000000")
    scans = []
    real = cache._evict
    monkeypatch.setattr(cache, "_evict", lambda *a, **k: scans.append(a) or real(*a, **k))
    for i in range(20):
        cache.cached_file(cache.make_key(f"s{i}"), "so", _writer(b"x" * 100))
    assert len(scans) == 1
    # ... but passing the cap still evicts at once
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "1500")
    cache.cached_file(cache.make_key("big"), "so", _writer(b"y" * 1000))
    assert len(scans) == 2
    total = sum(f.stat().st_size for f in private_cache.rglob("*") if f.is_file() and f.parent != private_cache)
    assert total <= 1500


def test_hit_refreshes_last_use(private_cache):
    k = cache.make_key("f")
    p = cache.cached_file(k, "so", _writer(b"F"))
    os.utime(p, (1, 1))
    cache.cached_file(k, "so", _writer(b"F"))
    assert os.stat(p).st_mtime > 1


def test_bad_cap_value_falls_back_to_default(monkeypatch):
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "lots")
    assert cache.max_bytes() == cache.DEFAULT_MAX_BYTES
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "0")
    assert cache.max_bytes() == 0
