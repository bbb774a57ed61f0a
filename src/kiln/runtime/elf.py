"""Minimal ELF64 reader: section bytes and exported function symbols, using ``struct`` only.

Kiln reads the module blob out of a library *before* ``dlopen`` and ``kiln inspect`` never
loads the library at all, so no code from an untrusted or broken file runs just to look at
it. Only what those two need is implemented; every offset is bounds-checked and any
inconsistency raises :class:`~kiln.runtime.errors.FormatError`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from .errors import FormatError, KilnFileNotFoundError

__all__ = ["ElfFile", "Section", "read_section", "exported_functions", "is_elf"]

_MAGIC = b"\x7fELF"
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHT_NOBITS = 8
_STT_FUNC = 2
_STB_GLOBAL = 1
_STB_WEAK = 2
_SHN_UNDEF = 0
_MAX_SECTIONS = 1 << 16


@dataclass(frozen=True)
class Section:
    """One section header."""

    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int


def is_elf(path: str | os.PathLike) -> bool:
    """Whether the file starts with the ELF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


class ElfFile:
    """Section table of an ELF64 file (the file is reread on demand, never mapped executable).

    Raises
    ------
    KilnFileNotFoundError
        If the path does not exist.
    FormatError
        If the file is not a well-formed ELF64 file.
    """

    def __init__(self, path: str | os.PathLike, size: int | None = None) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise KilnFileNotFoundError(f"no such file: {self.path}")
        # ``size`` bounds the image when bytes follow it (the digest trailer, kiln.runtime.digest).
        self.size = os.path.getsize(self.path) if size is None else size
        with open(self.path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 4 or ident[:4] != _MAGIC:
                raise FormatError(f"{self.path}: not an ELF file (bad magic {ident[:4]!r})")
            if len(ident) < 64:
                raise FormatError(f"{self.path}: truncated ELF header ({len(ident)} bytes)")
            if ident[4] != 2:
                raise FormatError(f"{self.path}: only 64-bit ELF is supported (EI_CLASS={ident[4]})")
            if ident[5] not in (1, 2):
                raise FormatError(f"{self.path}: bad ELF byte order (EI_DATA={ident[5]})")
            self.endian = "<" if ident[5] == 1 else ">"
            e = self.endian
            (self.e_type, self.e_machine) = struct.unpack_from(e + "HH", ident, 16)
            (phoff, shoff) = struct.unpack_from(e + "QQ", ident, 32)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", ident, 54)
            self.sections = self._read_sections(f, shoff, shentsize, shnum, shstrndx)
            self._end = self._content_end(f, phoff, phentsize, phnum, shoff, shnum)

    # ---- low level -----------------------------------------------------------------
    def _read(self, f: BinaryIO, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise FormatError(
                f"{self.path}: {what} at offset {offset} size {size} lies outside the file ({self.size} bytes)"
            )
        f.seek(offset)
        data = f.read(size)
        if len(data) != size:
            raise FormatError(f"{self.path}: short read of {what} at offset {offset}")
        return data

    def _read_sections(self, f: BinaryIO, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> list[Section]:
        e = self.endian
        if shoff == 0:
            return []
        if shentsize != 64:
            raise FormatError(f"{self.path}: unexpected section header size {shentsize}")
        first = self._read(f, shoff, 64, "section header 0")
        if shnum == 0:  # extended numbering: real count in sh_size of section 0
            shnum = struct.unpack_from(e + "Q", first, 32)[0]
        if shstrndx == 0xFFFF:
            shstrndx = struct.unpack_from(e + "I", first, 40)[0]
        if shnum > _MAX_SECTIONS:
            raise FormatError(f"{self.path}: implausible section count {shnum}")
        raw = self._read(f, shoff, 64 * shnum, "section header table")
        hdrs = []
        for i in range(shnum):
            name, typ, flags, _addr, off, size, link, _info, _align, entsize = struct.unpack_from(
                e + "IIQQQQIIQQ", raw, 64 * i
            )
            hdrs.append((name, typ, flags, off, size, link, entsize))
        names = b""
        if 0 < shstrndx < shnum:
            _, typ, _, off, size, _, _ = hdrs[shstrndx]
            if typ != _SHT_NOBITS:
                names = self._read(f, off, size, "section name table")
        out = []
        for name_off, typ, flags, off, size, link, entsize in hdrs:
            out.append(Section(_cstr(names, name_off), typ, flags, off, size, link, entsize))
        return out

    def _content_end(self, f: BinaryIO, phoff: int, phentsize: int, phnum: int, shoff: int, shnum: int) -> int:
        end = 64
        if shoff:
            end = max(end, shoff + 64 * len(self.sections))
        for s in self.sections:
            if s.type != _SHT_NOBITS:
                end = max(end, s.offset + s.size)
        if phoff and phnum:
            if phentsize != 56:
                raise FormatError(f"{self.path}: unexpected program header size {phentsize}")
            raw = self._read(f, phoff, 56 * phnum, "program header table")
            end = max(end, phoff + 56 * phnum)
            for i in range(phnum):
                p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(self.endian + "QQQQ", raw, 56 * i + 8)
                if p_offset + p_filesz > self.size:
                    raise FormatError(f"{self.path}: segment {i} at offset {p_offset} size {p_filesz} lies "
                                      f"outside the file ({self.size} bytes)")
                end = max(end, p_offset + p_filesz)
        return end

    # ---- queries -------------------------------------------------------------------
    def content_end(self) -> int:
        """Offset just past the last byte any section, segment or header table refers to.

        Bytes beyond it are ignored by the dynamic loader; :func:`kiln.runtime.export` only
        accepts them as a digest trailer.
        """
        return self._end

    def find_section(self, name: str) -> Section | None:
        """The first section called ``name``, or ``None``."""
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def section_data(self, section: Section | str) -> bytes | None:
        """Bytes of a section (``None`` if absent; empty for NOBITS sections)."""
        sec = self.find_section(section) if isinstance(section, str) else section
        if sec is None:
            return None
        if sec.type == _SHT_NOBITS:
            return b""
        with open(self.path, "rb") as f:
            return self._read(f, sec.offset, sec.size, f"section {sec.name!r}")

    def section_header_bytes(self, name: str, nbytes: int) -> bytes | None:
        """The first ``nbytes`` of a section (to peek at a header without reading a big payload)."""
        sec = self.find_section(name)
        if sec is None:
            return None
        with open(self.path, "rb") as f:
            return self._read(f, sec.offset, min(nbytes, sec.size), f"section {name!r}")

    def has_symbol_table(self) -> bool:
        """Whether the file has ``.dynsym`` or ``.symtab`` (so :meth:`exported_functions` is complete)."""
        return any(s.type in (_SHT_DYNSYM, _SHT_SYMTAB) for s in self.sections)

    def exported_functions(self) -> list[str]:
        """Names of defined, global/weak, default-visibility FUNC symbols.

        Uses ``.dynsym`` when present (shared libraries), else ``.symtab`` (object files).
        """
        table = next((s for s in self.sections if s.type == _SHT_DYNSYM), None)
        if table is None:
            table = next((s for s in self.sections if s.type == _SHT_SYMTAB), None)
        if table is None:
            return []
        if table.entsize not in (0, 24):
            raise FormatError(f"{self.path}: unexpected symbol entry size {table.entsize}")
        if not 0 <= table.link < len(self.sections):
            raise FormatError(f"{self.path}: symbol table links to missing section {table.link}")
        syms = self.section_data(table) or b""
        strtab = self.section_data(self.sections[table.link]) or b""
        e = self.endian
        names = []
        for off in range(0, len(syms) - len(syms) % 24, 24):
            name_off, info, other, shndx, _value, _size = struct.unpack_from(e + "IBBHQQ", syms, off)
            if (info & 0xF) != _STT_FUNC or (info >> 4) not in (_STB_GLOBAL, _STB_WEAK):
                continue
            if shndx == _SHN_UNDEF or (other & 0x3) not in (0, 3):  # default or protected
                continue
            name = _cstr(strtab, name_off)
            if name:
                names.append(name)
        return sorted(set(names))


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        return ""
    end = table.find(b"\0", offset)
    if end < 0:
        end = len(table)
    return table[offset:end].decode("utf-8", "replace")


def read_section(path: str | os.PathLike, name: str) -> bytes | None:
    """Bytes of section ``name`` of the ELF file at ``path`` (``None`` if absent)."""
    return ElfFile(path).section_data(name)


def exported_functions(path: str | os.PathLike) -> list[str]:
    """Exported function names of the ELF file at ``path``."""
    return ElfFile(path).exported_functions()
