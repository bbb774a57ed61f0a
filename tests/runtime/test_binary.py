"""kiln.runtime.binary: Writer/Reader round trips and every bounds error of the Reader."""

from __future__ import annotations

import io
import struct

import pytest

from kiln.runtime.binary import Reader, Writer
from kiln.runtime.errors import FormatError, InputError


def _all_fields() -> bytes:
    w = Writer()
    w.u8(0xAB)
    w.u16(0xBEEF)
    w.u32(0xDEADBEEF)
    w.u64(2**64 - 1)
    w.i32(-5)
    w.i64(-(2**63))
    w.string("héllo")
    w.sized_bytes(b"\x00\xff")
    w.u64_vector([0, 1, 2**64 - 1])
    w.pack(struct.Struct("<hB"), -2, 7)
    w.raw(memoryview(b"tail"))
    return w.getvalue()


def _read_all(r: Reader) -> list[object]:
    out: list[object] = [r.u8("a"), r.u16("b"), r.u32("c"), r.u64("d"), r.i32("e"), r.i64("f"),
                         r.string("g"), r.sized_bytes("h"), r.u64_vector("i"),
                         r.unpack(struct.Struct("<hB"), "j"), r.raw(4, "k")]
    r.expect_end("the tail")
    return out


EXPECTED = [0xAB, 0xBEEF, 0xDEADBEEF, 2**64 - 1, -5, -(2**63), "héllo", b"\x00\xff", [0, 1, 2**64 - 1],
            (-2, 7), b"tail"]


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_round_trip_from_buffer(wrap):
    data = _all_fields()
    r = Reader(wrap(data), "test data")
    assert _read_all(r) == EXPECTED
    assert r.pos == r.size == len(data) and r.remaining == 0


def test_round_trip_from_file():
    data = _all_fields()
    assert _read_all(Reader(io.BytesIO(data), "test file", size=len(data))) == EXPECTED


def test_little_endian_layout():
    w = Writer()
    w.u32(1)
    w.string("x")
    assert w.getvalue() == b"\x01\x00\x00\x00" + b"\x01" + bytes(7) + b"x"


@pytest.mark.parametrize("source", ["buffer", "file"])
def test_read_into_and_view(source):
    data = b"0123456789"
    r = Reader(data if source == "buffer" else io.BytesIO(data), "d", size=len(data))
    assert bytes(r.view(3, "head")) == b"012"
    dst = bytearray(4)
    r.read_into(memoryview(dst), "body")
    assert dst == b"3456" and r.remaining == 3
    with pytest.raises(FormatError, match=r"^d at offset 7: truncated: expected 4 bytes of more, only 3 left$"):
        r.read_into(memoryview(bytearray(4)), "more")


@pytest.mark.parametrize("method, size", [("u8", 1), ("u16", 2), ("u32", 4), ("u64", 8), ("i32", 4), ("i64", 8)])
def test_every_integer_is_bounds_checked(method, size):
    for cut in range(size):
        r = Reader(bytes(cut), "ints")
        with pytest.raises(FormatError, match=rf"ints at offset 0: truncated: expected {size} bytes of thing, "
                                              rf"only {cut} left"):
            getattr(r, method)("thing")
        assert r.pos == 0  # a failed read consumes nothing


def test_truncated_fields_name_where_what_and_offset():
    w = Writer()
    w.u32(0)
    w.u64(10)
    w.raw(b"abc")
    data = w.getvalue()
    r = Reader(data, "my blob")
    r.u32("pad")
    with pytest.raises(FormatError, match=r"my blob at offset 12: truncated: expected 10 bytes of name, only 3 left"):
        r.string("name")
    with pytest.raises(FormatError, match=r"truncated: expected 4 bytes of raw"):
        Reader(b"abc", "x").raw(4, "raw")
    with pytest.raises(FormatError, match=r"truncated: expected 4 bytes of v"):
        Reader(b"abc", "x").view(4, "v")


def test_counts_are_checked_before_allocating():
    huge = Writer()
    huge.u64(1 << 62)
    with pytest.raises(FormatError, match=r"at offset 0: items 4611686018427387904 cannot fit in the 0 bytes left"):
        Reader(huge.getvalue(), "c").count("items", 1)
    with pytest.raises(FormatError, match=r"rows length 4611686018427387904 cannot fit"):
        Reader(huge.getvalue(), "c").u64_vector("rows")
    w = Writer()
    w.u64(3)
    w.raw(bytes(16))
    assert Reader(w.getvalue(), "c").count("items", 5) == 3  # 15 <= 16
    with pytest.raises(FormatError, match="cannot fit in the 16 bytes left"):
        Reader(w.getvalue(), "c").count("items", 6)  # 18 > 16


def test_bad_utf8_names_the_string_and_its_offset():
    w = Writer()
    w.u8(0)
    w.sized_bytes(b"ok\xff")
    r = Reader(w.getvalue(), "names")
    r.u8("pad")
    with pytest.raises(FormatError,
                       match=r"names at offset 1: label is not valid UTF-8 \(invalid start byte at byte 2\)"):
        r.string("label")


def test_expect_end_reports_trailing_bytes():
    r = Reader(b"\x00\x01\x02", "t")
    r.u8("x")
    with pytest.raises(FormatError, match=r"t at offset 1: 2 unexpected trailing bytes after the x field"):
        r.expect_end("the x field")
    r.raw(2, "rest")
    r.expect_end("everything")


def test_error_offset_defaults_to_position():
    r = Reader(b"\x00" * 4, "src")
    r.u16("a")
    assert str(r.error("bad")) == "src at offset 2: bad"
    assert str(r.error("bad", at=0)) == "src at offset 0: bad"


def test_file_that_shrinks_is_a_format_error():
    # The declared size is larger than the file really is (it was truncated while open).
    r = Reader(io.BytesIO(b"abc"), "f", size=8)
    with pytest.raises(FormatError, match=r"truncated: expected 8 bytes of x, got 3"):
        r.u64("x")
    r = Reader(io.BytesIO(b"abc"), "f", size=8)
    with pytest.raises(FormatError, match=r"truncated: expected 5 bytes of y, got 3"):
        r.read_into(memoryview(bytearray(5)), "y")


def test_misuse_is_a_kiln_error():
    with pytest.raises(InputError, match="needs its size"):
        Reader(io.BytesIO(b""), "f")
    with pytest.raises(InputError, match="exceeds"):
        Reader(b"ab", "b", size=3)


def test_writer_chunks_keep_memoryviews_uncopied():
    big = memoryview(bytearray(1024))
    w = Writer()
    w.u64(1024)
    w.raw(big)
    chunks = list(w.chunks())
    assert chunks[1] is big
    assert b"".join(chunks) == w.getvalue()
