"""Tensors, iteration variables and the operations that produce tensors."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from ..runtime.errors import CompileError
from ..tir.dtype import check_dtype
from ..tir.expr import ExprOp, IntImm, PrimExpr, ProducerLoad, Reduce, Var, convert
from ..tir.functor import post_order_visit

__all__ = ["IterVar", "Tensor", "Operation", "PlaceholderOp", "ComputeOp", "placeholder", "compute", "reduce_axis",
           "set_dyn"]


class IterVar(ExprOp):
    """An iteration variable over ``range(dom_min, dom_min + dom_extent)``.

    ``iter_type`` is ``"data_par"`` for output axes and ``"reduce"`` for reduction axes.
    An IterVar can be used directly in expressions (it stands for its :attr:`var`).
    """

    DATA_PAR = "data_par"
    REDUCE = "reduce"

    def __init__(self, dom: tuple[int, int], name: str, iter_type: str = "data_par") -> None:
        self.dom_min, self.dom_extent = int(dom[0]), int(dom[1])
        self.var = Var(name, "int32")
        self.iter_type = iter_type

    @property
    def name(self) -> str:
        """The variable's name."""
        return self.var.name

    @property
    def dom(self) -> tuple[int, int]:
        """``(min, extent)`` of the iteration domain."""
        return (self.dom_min, self.dom_extent)

    def __repr__(self) -> str:
        return f"IterVar({self.name}, range({self.dom_min}, {self.dom_min + self.dom_extent}), {self.iter_type})"

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def reduce_axis(dom: tuple[int, int] | Sequence[int] | int, name: str = "rv") -> IterVar:
    """A reduction axis over ``range(lo, hi)``.

    Parameters
    ----------
    dom : (lo, hi) or int
        Half-open range; an int ``n`` means ``(0, n)``.
    name : str
        Variable name (shows up in printed loop nests).
    """
    if isinstance(dom, (int, IntImm)):
        lo, hi = 0, int(dom)
    else:
        lo, hi = (int(d) for d in dom)
    if hi < lo:
        raise CompileError(f"reduce_axis {name}: empty range ({lo}, {hi})")
    return IterVar((lo, hi - lo), name, IterVar.REDUCE)


def _static_shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, IntImm, PrimExpr)):
        shape = (shape,)
    out = []
    for s in shape:
        if isinstance(s, IntImm):
            s = s.value
        if not isinstance(s, int):
            try:
                import numpy as np

                if isinstance(s, np.integer):
                    s = int(s)
            except ImportError:  # pragma: no cover
                pass
        if not isinstance(s, int):
            raise CompileError(f"{what}: shapes must be static integers, got {s!r} in {tuple(shape)}")
        if s < 0:
            raise CompileError(f"{what}: negative extent {s}")
        out.append(s)
    return tuple(out)


class Tensor:
    """The ``value_index``-th output of an :class:`Operation`.

    ``T[i, j]`` reads an element (indices are expressions, IterVars or ints).

    ``shape`` is static: for a tensor with dynamic dimensions it holds their upper bounds and
    ``dyn`` says which dimensions are dynamic (one ``tir.Var`` or None per dimension; None
    for the whole tuple when every dimension is static).  For a placeholder ``dyn`` comes from
    :func:`placeholder`; for a computed tensor it is None ("infer it from the reads when
    lowering") unless set with :func:`set_dyn`, which is then authoritative.
    """

    def __init__(self, op: "Operation", value_index: int, shape: tuple[int, ...], dtype: str) -> None:
        self.op, self.value_index, self.shape, self.dtype = op, value_index, shape, dtype
        self.dyn: tuple[Var | None, ...] | None = None

    @property
    def name(self) -> str:
        """Name of the producing operation (with ``.vN`` for extra outputs)."""
        return self.op.name if self.value_index == 0 else f"{self.op.name}.v{self.value_index}"

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __getitem__(self, idx: Any) -> PrimExpr:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise CompileError(f"tensor {self.name} has {len(self.shape)} dims, indexed with {len(idx)}")
        return ProducerLoad(self, [convert(i, "int32") for i in idx])

    def __call__(self, *idx: Any) -> PrimExpr:
        return self[tuple(idx)]

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"

    __hash__ = object.__hash__
    __eq__ = object.__eq__


class Operation:
    """Base of tensor-producing operations: ``name``, ``tag``, ``attrs``, ``outputs``."""

    name: str
    tag: str
    attrs: dict[str, Any]
    outputs: list[Tensor]

    @property
    def num_outputs(self) -> int:
        """Number of output tensors."""
        return len(self.outputs)

    def output(self, i: int) -> Tensor:
        """The ``i``-th output tensor."""
        return self.outputs[i]

    @property
    def input_tensors(self) -> list[Tensor]:
        """Tensors this operation reads, in order of first use."""
        return []

    @property
    def axis(self) -> list[IterVar]:
        return []

    @property
    def reduce_axis(self) -> list[IterVar]:
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class PlaceholderOp(Operation):
    """An input tensor of a kernel."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str,
                 dyn: tuple[Var | None, ...] | None = None) -> None:
        self.name, self.tag, self.attrs = name, "", {}
        self.shape, self.dtype = shape, dtype
        self.outputs = [Tensor(self, 0, shape, dtype)]
        self.outputs[0].dyn = dyn


class ComputeOp(Operation):
    """``out[axis] = body`` for every point of ``axis`` (``body`` may be a top-level :class:`Reduce`)."""

    def __init__(self, name: str, tag: str, attrs: dict[str, Any] | None, axis: list[IterVar],
                 body: list[PrimExpr]) -> None:
        self.name, self.tag, self.attrs = name, tag, dict(attrs or {})
        self._axis = axis
        self.body = body
        red = [b for b in body if isinstance(b, Reduce)]
        if red and len(red) != len(body):
            raise CompileError(f"compute {name}: either every output or none may be a reduction")
        self._reduce_axis = list(red[0].axis) if red else []
        for b in body:
            _check_no_nested_reduce(name, b)
        shape = tuple(iv.dom_extent for iv in axis)
        self.outputs = [Tensor(self, i, shape, b.dtype) for i, b in enumerate(body)]
        self._inputs: list[Tensor] | None = None

    @property
    def axis(self) -> list[IterVar]:
        """Data-parallel axes (one per output dimension)."""
        return self._axis

    @property
    def reduce_axis(self) -> list[IterVar]:
        """Reduction axes of the body (empty for injective computes)."""
        return self._reduce_axis

    @property
    def input_tensors(self) -> list[Tensor]:
        if self._inputs is None:
            seen: dict[int, Tensor] = {}

            def f(n: Any) -> None:
                if isinstance(n, ProducerLoad) and id(n.producer) not in seen:
                    seen[id(n.producer)] = n.producer

            for b in self.body:
                post_order_visit(b, f)
            self._inputs = list(seen.values())
        return self._inputs


def _check_no_nested_reduce(name: str, body: PrimExpr) -> None:
    top = body

    def f(n: Any) -> None:
        if isinstance(n, Reduce) and n is not top:
            raise CompileError(
                f"compute {name}: a reduction (te.sum/max/...) must be the whole compute body; "
                "put arithmetic on the reduced value in a separate te.compute"
            )

    post_order_visit(body, f)


def _check_dyn(shape: tuple[int, ...], dyn: Sequence[Var | None] | None, what: str) -> tuple[Var | None, ...] | None:
    if dyn is None:
        return None
    dyn = tuple(dyn)
    if len(dyn) != len(shape):
        raise CompileError(f"{what}: dyn has {len(dyn)} entries for {len(shape)} dims")
    for d, v in enumerate(dyn):
        if v is not None and not (isinstance(v, Var) and v.dtype in ("int32", "int64")):
            raise CompileError(f"{what}: dyn[{d}] must be an int32/int64 tir.Var or None, got {v!r}")
    return dyn


def placeholder(shape: Sequence[int] | int, dtype: str = "float32", name: str = "placeholder",
                dyn: Sequence[Var | None] | None = None) -> Tensor:
    """An input tensor.

    Parameters
    ----------
    shape : tuple of int
        Static shape; for dynamic dimensions their upper bounds (the storage is always this
        shape, row-major).
    dtype : str
        Element type ("float32", "float16", "bfloat16", "int8", ..., "bool").
    name : str
        Name (used for the kernel argument and error messages).
    dyn : tuple of (tir.Var or None), optional
        One entry per dimension: a Var (``te.var("n")``) for a dimension whose actual extent
        ``<= shape[d]`` is given at run time by the argument's ``DLTensor::shape``, None for
        a static one.  The same Var in several tensors means the same extent.

    Returns
    -------
    Tensor
        With ``dyn`` set (None when every dimension is static).
    """
    shp = _static_shape(shape, f"placeholder {name}")
    dy = _check_dyn(shp, dyn, f"placeholder {name}")
    if dy is not None and all(v is None for v in dy):
        dy = None
    return PlaceholderOp(name, shp, check_dtype(dtype), dy).output(0)


def set_dyn(tensor: Tensor, dyn: Sequence[Var | None] | None) -> Tensor:
    """Declare the dynamic dimensions of a computed tensor (usually a kernel output).

    The declaration is authoritative: lowering uses it instead of inferring the runtime
    extents of ``tensor``'s data axes from what it reads, and fails with a
    :class:`~kiln.runtime.errors.CompileError` when a read cannot be proved to stay inside
    the valid region under it.  ``dyn=None`` returns the tensor to "infer"; a tuple of Nones
    declares it static.

    Parameters
    ----------
    tensor : Tensor
        A computed tensor (placeholders take ``dyn`` in :func:`placeholder`).
    dyn : tuple of (tir.Var or None) or None
        One entry per dimension, as for :func:`placeholder`.

    Returns
    -------
    Tensor
        ``tensor`` itself.
    """
    if isinstance(tensor.op, PlaceholderOp):
        raise CompileError(f"set_dyn: {tensor.name} is a placeholder; pass dyn= to te.placeholder")
    tensor.dyn = _check_dyn(tensor.shape, dyn, f"set_dyn {tensor.name}")
    return tensor


def compute(shape: Sequence[int] | int, fcompute: Callable[..., Any], name: str = "compute", tag: str = "",
            attrs: dict[str, Any] | None = None) -> Tensor | tuple[Tensor, ...]:
    """A tensor defined elementwise by ``fcompute(*indices)``.

    Parameters
    ----------
    shape : tuple of int
        Output shape.
    fcompute : callable
        Called once with one index :class:`Var` per dimension (named after the callable's
        parameters); returns the element expression, a top-level reduction, or a tuple of
        expressions for an operation with several outputs.
    name, tag : str
        Operation name and a free-form tag schedules dispatch on (e.g. ``"elemwise"``,
        ``"broadcast"``, ``"injective"``, ``"conv2d_nchw"``).
    attrs : dict, optional
        Free-form metadata kept on the operation.

    Returns
    -------
    Tensor or tuple of Tensor
    """
    shp = _static_shape(shape, f"compute {name}")
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):  # builtins
        params = []
    # parameters with defaults (``lambda i, f=f: ...``) are closures, not indices
    params = [p for p in params if p.default is p.empty or p.kind == p.VAR_POSITIONAL]
    if params and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        if len(params) != len(shp):
            raise CompileError(
                f"compute {name}: fcompute takes {len(params)} indices but the shape has {len(shp)} dims"
            )
        names = [p.name for p in params]
    else:
        names = [f"i{k}" for k in range(len(shp))]
    axis = [IterVar((0, n), nm) for n, nm in zip(shp, names)]
    res = fcompute(*[iv.var for iv in axis])
    multi = isinstance(res, (tuple, list))
    body = [convert(r) for r in (res if multi else [res])]
    op = ComputeOp(name, tag, attrs, axis, body)
    return tuple(op.outputs) if multi else op.output(0)


_ = Var
