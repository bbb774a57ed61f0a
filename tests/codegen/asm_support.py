"""Reading generated x86 assembly in tests: find the hot loop of a kernel."""

from __future__ import annotations

import re


def loops(asm: str) -> list[str]:
    """Every loop of ``asm`` as text: from a ``.LBB`` label to the backward jump to it."""
    lines = asm.splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = re.match(r"(\.LBB\S+):", ln)
        if m:
            for j in range(i + 1, len(lines)):
                if re.match(rf"\s+j\w+\s+{re.escape(m.group(1))}$", lines[j]):
                    out.append("\n".join(lines[i:j + 1]))
                    break
    return out


def hot_loop(asm: str, op: str) -> str:
    """The innermost of the loops holding the most ``op`` instructions (an outer loop counts
    its inner loops' too, so ties go to the shorter text)."""
    found = loops(asm)
    assert found, asm
    return max(found, key=lambda blk: (blk.count(op), -len(blk)))
