"""Helpers shared by the compute definitions: tags, accumulation dtypes, broadcasting."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .. import te
from ..runtime.errors import CompileError

__all__ = [
    "TAG_ELEMWISE", "TAG_BROADCAST", "TAG_INJECTIVE", "INJECTIVE_TAGS", "is_injective_stage",
    "acc_dtype", "compute_dtype", "to_compute", "norm_axis", "broadcast_index", "prod",
    "traverse_stages",
]

#: Tags of stages that are pure index/value maps: schedules inline them unless they are outputs.
TAG_ELEMWISE = "elemwise"
TAG_BROADCAST = "broadcast"
TAG_INJECTIVE = "injective"
INJECTIVE_TAGS = frozenset({TAG_ELEMWISE, TAG_BROADCAST, TAG_INJECTIVE})


def is_injective_stage(op: Any) -> bool:
    """A compute op that may be inlined: no reduction and an injective tag (or no tag)."""
    if not isinstance(op, te.ComputeOp) or op.reduce_axis:
        return False
    return op.tag in INJECTIVE_TAGS or op.tag == ""


def output_stage(out: te.Tensor, dtype: str, name: str) -> te.Tensor:
    """``out`` cast to ``dtype`` as a separate elementwise stage.

    Always its own stage, even without a dtype change: the reduction then accumulates into a
    small local tile attached to this stage's loops (what TVM's cache_write gives), and a fused
    epilogue simply replaces it.
    """
    res = te.compute(out.shape, lambda *i: te.cast(out[i], dtype), name=name, tag=TAG_ELEMWISE)
    assert isinstance(res, te.Tensor)  # one output
    return res


def acc_dtype(dtype: str) -> str:
    """Accumulation dtype of sums/products: float16/bfloat16 accumulate in float32.

    Integer sums keep their dtype: wrap-around arithmetic is exact modulo 2^bits, which is
    what the references produce after their wide accumulation is cast back.
    """
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def compute_dtype(dtype: str) -> str:
    """Dtype to evaluate float math in: half types are computed in float32."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def to_compute(x: Any, dtype: str) -> Any:
    """Cast ``x`` (of ``dtype``) to :func:`compute_dtype`."""
    cd = compute_dtype(dtype)
    return x if cd == dtype else te.cast(x, cd)


def norm_axis(axis: int, ndim: int) -> int:
    """Non-negative axis."""
    if not -ndim <= axis < max(ndim, 1):
        raise CompileError(f"axis {axis} out of range for a {ndim}-D tensor")
    return axis + ndim if axis < 0 else axis


def prod(xs: Iterable[int]) -> int:
    """Product of ints (1 for empty)."""
    out = 1
    for x in xs:
        out *= int(x)
    return out


def broadcast_index(t: te.Tensor, out_idx: Sequence[Any]) -> list[Any]:
    """Indices into ``t`` for output indices ``out_idx`` under NumPy broadcasting (right-aligned)."""
    off = len(out_idx) - len(t.shape)
    if off < 0:
        raise CompileError(f"cannot broadcast {t.name} of shape {t.shape} to rank {len(out_idx)}")
    return [0 if d == 1 else out_idx[off + k] for k, d in enumerate(t.shape)]


def bload(t: te.Tensor, out_idx: Sequence[Any]) -> Any:
    """``t`` read at broadcast indices (0-d tensors read as scalars)."""
    idx = broadcast_index(t, out_idx)
    return t[tuple(idx)] if idx else t()


def load(t: te.Tensor, idx: Sequence[Any]) -> Any:
    """``t[idx]`` that also works for 0-d tensors."""
    return t[tuple(idx)] if len(idx) else t()


def const_like(value: Any, dtype: str) -> Any:
    """A constant of ``dtype`` (float constants keep their value in float dtypes)."""
    return te.const(value, dtype)


def traverse_stages(outs: Sequence[te.Tensor]) -> list[te.Operation]:
    """All compute operations reachable from ``outs``, producers first."""
    order: list[te.Operation] = []
    seen: set[int] = set()

    def visit(op: te.Operation) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        for t in op.input_tensors:
            visit(t.op)
        if isinstance(op, te.ComputeOp):
            order.append(op)

    for o in outs:
        visit(o.op)
    return order

