"""Lowering of ONNX Einsum to reduce_sum / transpose / reshape / matmul.

Operands are contracted pairwise, left to right. For each pair the shared labels that are still
needed (in the output or in a later operand) become matmul batch dims, the other shared labels
are contracted, and each side's own labels become the M and N dims. A label repeated within
one operand (``ii``) first takes that operand's diagonal.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ...ir import Value
from .converter import Context

_ELL = "0123456789"  # labels standing for ellipsis dims, numbered from the right


def _parse(ctx: Context, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.bad(f"equation {equation!r} has {len(terms)} operands, got {len(ranks)}")
    max_ell = 0
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            pre, _, post = t.partition("...")
            n = r - len(pre) - len(post)
            if n < 0:
                raise ctx.bad(f"term {t!r} does not fit rank {r}")
            max_ell = max(max_ell, n)
            t = pre + "".join(_ELL[i] for i in reversed(range(n))) + post
        if len(t) != r:
            raise ctx.bad(f"term {t!r} does not match operand rank {r}")
        out_terms.append(t)
    ell = "".join(_ELL[i] for i in reversed(range(max_ell)))
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(out_terms)
        out = ell + "".join(sorted(c for c in set(letters) if c in string.ascii_letters
                                   and letters.count(c) == 1))
    return out_terms, out


def _sum_out(ctx: Context, v: Value, labels: str, drop: set[str]) -> tuple[Value, str]:
    axes = tuple(i for i, c in enumerate(labels) if c in drop)
    if not axes:
        return v, labels
    v = ctx.emit1("reduce_sum", v, axes=axes, keepdims=False)
    return v, "".join(c for c in labels if c not in drop)


def _permute(ctx: Context, v: Value, labels: str, order: str) -> Value:
    perm = tuple(labels.index(c) for c in order)
    if perm == tuple(range(len(perm))):
        return v
    return ctx.emit1("transpose", v, axes=perm)


def _diagonal(ctx: Context, v: Value, labels: str) -> tuple[Value, str]:
    """Take the diagonal over every label repeated in ``labels`` (``"0ii"`` -> ``"0i"``).

    The two dims of a repeated label move to the end, merge into one of n*n elements, and a
    gather of the elements ``k * (n + 1)`` keeps the diagonal (exact, unlike masking with an
    identity matrix, which turns inf/nan off the diagonal into nan).
    """
    while True:
        rep = next((c for c in labels if labels.count(c) > 1), None)
        if rep is None:
            return v, labels
        i = labels.index(rep)
        j = labels.index(rep, i + 1)
        n = v.shape[i]
        if v.shape[j] != n:
            raise ctx.bad(f"Einsum label {rep!r} repeats in term {labels!r} with sizes {n} and "
                          f"{v.shape[j]}; a diagonal needs equal sizes")
        rest = [k for k in range(len(labels)) if k not in (i, j)]
        perm = tuple(rest) + (i, j)
        if perm != tuple(range(len(perm))):
            v = ctx.emit1("transpose", v, axes=perm)
        lead = tuple(v.shape[:-2])
        v = ctx.reshape(v, lead + (n * n,))
        idx = ctx.const(np.arange(n, dtype=np.int64) * (n + 1))
        v = ctx.emit1("take", v, idx, axis=len(lead))
        labels = "".join(labels[k] for k in rest) + rep


def lower_einsum(ctx: Context, equation: str, operands: list[Value]) -> Value:
    """Emit IR for ``einsum(equation, *operands)`` and return the result value."""
    terms, out = _parse(ctx, equation, [v.type.ndim for v in operands])
    if len(set(out)) != len(out):
        raise ctx.bad(f"Einsum output {out!r} repeats a label")
    operands = list(operands)
    for k, t in enumerate(terms):
        if len(set(t)) != len(t):
            operands[k], terms[k] = _diagonal(ctx, operands[k], t)
    sizes: dict[str, int] = {}
    for t, v in zip(terms, operands):
        for c, d in zip(t, v.shape):
            if sizes.setdefault(c, d) != d:
                raise ctx.unsupported(f"Einsum label {c!r} has sizes {sizes[c]} and {d} "
                                      f"(broadcasting labels is not supported)")
    vals = list(operands)
    labs = list(terms)
    # Sum out labels private to one operand and absent from the output.
    for i in range(len(vals)):
        others = set(out).union(*(set(t) for j, t in enumerate(labs) if j != i))
        vals[i], labs[i] = _sum_out(ctx, vals[i], labs[i], set(labs[i]) - others)
    acc, la = vals[0], labs[0]
    for k in range(1, len(vals)):
        b, lb = vals[k], labs[k]
        keep = set(out).union(*(set(t) for t in labs[k + 1:]))
        batch = [c for c in la if c in lb and c in keep]
        contr = [c for c in la if c in lb and c not in keep]
        left = [c for c in la if c not in lb]
        right = [c for c in lb if c not in la]
        nb = math.prod(sizes[c] for c in batch)
        nl = math.prod(sizes[c] for c in left)
        nk = math.prod(sizes[c] for c in contr)
        nr = math.prod(sizes[c] for c in right)
        a2 = ctx.reshape(_permute(ctx, acc, la, "".join(batch + left + contr)), (nb, nl, nk))
        b2 = ctx.reshape(_permute(ctx, b, lb, "".join(batch + contr + right)), (nb, nk, nr))
        prod = ctx.emit1("matmul", a2, b2)
        la = "".join(batch + left + right)
        acc = ctx.reshape(prod, tuple(sizes[c] for c in la))
    acc, la = _sum_out(ctx, acc, la, set(la) - set(out))
    missing = set(out) - set(la)
    if missing:
        raise ctx.bad(f"output labels {sorted(missing)} appear in no operand")
    res = _permute(ctx, acc, la, out)
    if res is operands[0]:
        res = ctx.emit1("identity", res)
    return res
