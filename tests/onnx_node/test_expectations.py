"""The node-suite expectation file (``expectations.py``): format, round trip, the checked-in file."""

from __future__ import annotations

import pytest

from tests.onnx_node import expectations


def test_round_trip_sorted_one_case_per_line(tmp_path):
    path = str(tmp_path / "expected.txt")
    exp = {
        "test_b": expectations.Expected("fail", "import: UnsupportedOpError: Foo\nsecond line"),
        "test_a": expectations.Expected("pass", "slow alone"),
        "test_c": expectations.Expected("crash", "timed out after 120 s"),
        "test_d": expectations.Expected("pass"),
    }
    expectations.dump(exp, "9.9.9", path)
    version, back = expectations.load(path)
    assert version == "9.9.9"
    # a reason is kept on one line: the newline became a space
    assert back["test_b"] == expectations.Expected("fail", "import: UnsupportedOpError: Foo second line")
    assert back["test_a"].slow and back["test_a"].alone and back["test_a"].passes
    assert not back["test_d"].slow and not back["test_d"].alone
    assert not back["test_c"].passes and not back["test_c"].slow
    body = [ln for ln in open(path, encoding="utf-8").read().splitlines() if ln and not ln.startswith("#")]
    assert body == ["test_a pass slow alone", "test_b fail import: UnsupportedOpError: Foo second line",
                    "test_c crash timed out after 120 s", "test_d pass"]


@pytest.mark.parametrize("line, match", [
    ("test_a maybe", "expected '<case>"),
    ("test_a", "expected '<case>"),
    ("test_a pass\ntest_a fail x", "listed twice"),
])
def test_malformed_files_raise(tmp_path, line, match):
    path = tmp_path / "expected.txt"
    path.write_text(f"# onnx-version: 1.0\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        expectations.load(str(path))


def test_checked_in_file_is_sorted_and_parses():
    version, exp = expectations.load()
    assert version
    body = [ln.split()[0] for ln in open(expectations.PATH, encoding="utf-8").read().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert body == sorted(body) and len(body) == len(exp)
