"""Write a relocatable ELF object holding one data symbol, without an assembler.

``export_library`` embeds the module blob (often hundreds of megabytes of weights) in the
library as the symbol ``__kiln_dev_mblob`` in section ``.kiln_mblob``. Going through the
assembler (``.incbin`` of a workspace file) writes the blob to disk twice before the linker
reads it; writing the object here writes it once, straight from the serialized pieces.

The object is what ``as`` makes of the equivalent ``.S`` file (``kiln.runtime.export``):
an ELF64 little-endian ``ET_REL`` file with

* the data section (``SHT_PROGBITS``, flags ``SHF_ALLOC`` only, i.e. read-only data,
  8-byte aligned) holding the bytes;
* an empty ``.note.GNU-stack`` section, so the linker does not make the stack executable;
* ``.symtab`` with the null symbol and one global, default-visibility ``STT_OBJECT`` symbol
  at offset 0 of the data section whose size is the byte count;
* ``.strtab`` and ``.shstrtab``.

There are no relocations, so the object is the same for every supported machine except for
the ``e_machine`` / ``e_flags`` / OS-ABI fields; callers copy those from an object the same
compiler produced (:func:`read_object_header`), which also gets ABI flags such as RISC-V's
float ABI right. Only ELF64 little-endian machines in :data:`SUPPORTED_MACHINES` are written;
anything else keeps the assembler path.

Imports the standard library only.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Iterable

from .errors import FormatError, InputError

__all__ = [
    "EM_X86_64",
    "EM_AARCH64",
    "EM_RISCV",
    "SUPPORTED_MACHINES",
    "ObjectHeader",
    "read_object_header",
    "write_data_object",
]

EM_X86_64 = 62
EM_AARCH64 = 183
EM_RISCV = 243
#: ``e_machine`` values this writer is known to produce linkable objects for (ELF64 LE).
SUPPORTED_MACHINES: frozenset[int] = frozenset({EM_X86_64, EM_AARCH64, EM_RISCV})

_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_EV_CURRENT = 1
_ET_REL = 1
_SHT_PROGBITS = 1
_SHT_SYMTAB = 2
_SHT_STRTAB = 3
_SHF_ALLOC = 0x2
_STB_GLOBAL = 1
_STT_OBJECT = 1

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # 64 bytes
_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SYM = struct.Struct("<IBBHQQ")  # 24 bytes

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectHeader:
    """The target-describing fields of an ELF header.

    Attributes
    ----------
    machine : int
        ``e_machine`` (62 x86-64, 183 AArch64, 243 RISC-V).
    flags : int
        ``e_flags`` (processor-specific; e.g. RISC-V float ABI and compressed-code bits).
    osabi : int
        ``EI_OSABI`` (0 for System V, 3 for GNU).
    elf_class : int
        ``EI_CLASS``: 2 for ELF64.
    data : int
        ``EI_DATA``: 1 for little-endian.
    """

    machine: int
    flags: int = 0
    osabi: int = 0
    elf_class: int = _ELFCLASS64
    data: int = _ELFDATA2LSB

    @property
    def writable(self) -> bool:
        """Whether :func:`write_data_object` can write an object for this target."""
        return self.elf_class == _ELFCLASS64 and self.data == _ELFDATA2LSB and self.machine in SUPPORTED_MACHINES


def read_object_header(path: str | os.PathLike) -> ObjectHeader:
    """Read the target fields of the ELF file at ``path`` (an object the compiler wrote).

    Raises
    ------
    FormatError
        If the file is not ELF.
    """
    with open(path, "rb") as f:
        head = f.read(_EHDR.size)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise FormatError(f"{os.fspath(path)}: not an ELF file")
    endian = "<" if head[5] == _ELFDATA2LSB else ">"
    (machine,) = struct.unpack_from(endian + "H", head, 18)
    flags = 0
    if head[4] == _ELFCLASS64 and len(head) >= 52:
        (flags,) = struct.unpack_from(endian + "I", head, 48)
    return ObjectHeader(machine=machine, flags=flags, osabi=head[7], elf_class=head[4], data=head[5])


def _strtab(names: Iterable[str]) -> tuple[bytes, dict[str, int]]:
    table = bytearray(b"\0")
    offsets: dict[str, int] = {"": 0}
    for n in names:
        if n not in offsets:
            offsets[n] = len(table)
            table += n.encode("utf-8") + b"\0"
    return bytes(table), offsets


def _pad(n: int, align: int) -> int:
    return (-n) % align


def write_data_object(
    path: str | os.PathLike,
    chunks: Iterable[Buffer],
    section_name: str,
    symbol_name: str,
    header: ObjectHeader,
    align: int = 8,
) -> int:
    """Write a relocatable object whose ``section_name`` holds the concatenated ``chunks``.

    Parameters
    ----------
    path : path
        The object file to write (replaced if it exists).
    chunks : iterable of bytes-like
        The section contents, in order; written as they are, never joined in memory.
    section_name : str
        Name of the allocated, read-only data section.
    symbol_name : str
        Global ``STT_OBJECT`` symbol at the start of the section, sized to cover it.
    header : ObjectHeader
        Target fields (from :func:`read_object_header` of an object the compiler made).
    align : int
        Section alignment, a power of two.

    Returns
    -------
    int
        The section size in bytes.

    Raises
    ------
    InputError
        If ``header`` is not a target this writer supports (``header.writable`` is false)
        or ``align`` is not a power of two.
    """
    if not header.writable:
        raise InputError(
            f"write_data_object: unsupported target (class {header.elf_class}, data {header.data}, "
            f"machine {header.machine}); supported: ELF64 little-endian {sorted(SUPPORTED_MACHINES)}"
        )
    if align < 1 or align & (align - 1):
        raise InputError(f"write_data_object: alignment {align} is not a power of two")
    views = [memoryview(c).cast("B") for c in chunks]
    size = sum(v.nbytes for v in views)

    shstrtab, sh_off = _strtab(["", section_name, ".note.GNU-stack", ".symtab", ".strtab", ".shstrtab"])
    strtab, st_off = _strtab([symbol_name])
    symtab = _SYM.pack(0, 0, 0, 0, 0, 0) + _SYM.pack(
        st_off[symbol_name], (_STB_GLOBAL << 4) | _STT_OBJECT, 0, 1, 0, size
    )

    # Small tables first, then the section headers, then the data: everything but the data
    # is known up front, so the data is streamed last, piece by piece, with no seek.
    off = _EHDR.size
    symtab_off = off + _pad(off, 8)
    strtab_off = symtab_off + len(symtab)
    shstrtab_off = strtab_off + len(strtab)
    end = shstrtab_off + len(shstrtab)
    shoff = end + _pad(end, 8)
    n_sections = 6
    data_start = shoff + n_sections * _SHDR.size
    data_off = data_start + _pad(data_start, align)

    sections = [
        _SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        _SHDR.pack(sh_off[section_name], _SHT_PROGBITS, _SHF_ALLOC, 0, data_off, size, 0, 0, align, 0),
        _SHDR.pack(sh_off[".note.GNU-stack"], _SHT_PROGBITS, 0, 0, data_off, 0, 0, 0, 1, 0),
        # sh_link: the string table; sh_info: index of the first non-local symbol.
        _SHDR.pack(sh_off[".symtab"], _SHT_SYMTAB, 0, 0, symtab_off, len(symtab), 4, 1, 8, _SYM.size),
        _SHDR.pack(sh_off[".strtab"], _SHT_STRTAB, 0, 0, strtab_off, len(strtab), 0, 0, 1, 0),
        _SHDR.pack(sh_off[".shstrtab"], _SHT_STRTAB, 0, 0, shstrtab_off, len(shstrtab), 0, 0, 1, 0),
    ]
    ident = bytes([0x7F, ord("E"), ord("L"), ord("F"), _ELFCLASS64, _ELFDATA2LSB, _EV_CURRENT, header.osabi])
    ehdr = _EHDR.pack(
        ident.ljust(16, b"\0"), _ET_REL, header.machine, _EV_CURRENT,
        0, 0, shoff, header.flags, _EHDR.size, 0, 0, _SHDR.size, n_sections, 5,
    )
    head = bytearray(ehdr)
    head += bytes(symtab_off - len(head)) + symtab + strtab + shstrtab
    head += bytes(shoff - len(head))
    head += b"".join(sections)
    head += bytes(data_off - len(head))
    with open(path, "wb") as f:
        f.write(head)
        for v in views:
            f.write(v)
    return size
