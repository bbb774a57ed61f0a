"""Run-time shapes of a graph with symbolic dimensions.

A dynamic graph (``attrs.sym_shape`` in its JSON, ``docs/dynamic_shapes.md``) keeps every
entry's storage at its upper-bound shape: the *padded layout*. An entry of actual shape ``a``
holds its data in the sub-box ``[0:a0, 0:a1, ...]`` of that storage, so strides never change
and the memory plan stays static. What changes per input shape is the ``shape`` field of the
executor's DLTensors, from which every kernel reads its runtime extents.

:class:`DynamicShapes` binds the symbols from the inputs' shapes (checking ranges and that
inputs agree), evaluates every entry's dims with one compiled shape function when a symbol
changes, and writes them into the DLTensors. ``run()`` costs nothing extra while shapes stay
the same.
"""

from __future__ import annotations

import ctypes
from typing import Any, Collection, Mapping, Sequence

from . import sym
from .errors import InputError

__all__ = ["DynamicShapes", "max_strides", "data_dim_sources"]


def max_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides (in elements) of the upper-bound shape: the padded layout's strides."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= int(d)
    return out[::-1]


def data_dim_sources(graph: Any) -> dict[str, tuple[int, int]]:
    """``symbol -> (entry id, dim)`` for every data-dependent dim: the first kernel output that
    has the plain symbol as a dim. Its kernel writes the actual extent into that dim of its
    output DLTensor; the executor reads it from there after the kernel ran.

    Raises
    ------
    InputError
        A data-dependent dim that no kernel output carries (nothing could give its value).
    """
    if graph.sym_shape is None or not graph.data_dims:
        return {}
    args = {graph.entry_id(n) for n in graph.arg_nodes}
    out: dict[str, tuple[int, int]] = {}
    for e, dims in enumerate(graph.sym_shape):  # entries are numbered in execution order
        if e in args:
            continue
        for d, dim in enumerate(dims):
            if isinstance(dim, str) and dim in graph.data_dims and dim not in out:
                out[dim] = (e, d)
    missing = sorted(graph.data_dims - out.keys())
    if missing:
        raise InputError(f"data-dependent dimension(s) {missing} are the dim of no kernel output")
    return out


class DynamicShapes:
    """Symbol values and actual entry shapes of one executor.

    Parameters
    ----------
    graph : kiln.runtime.graph_json.Graph
        A graph with ``sym_shape``.
    tensors : sequence
        The executor's per-entry DLTensor holders (``.dl``, ``.shape``); their ``shape``
        arrays are rewritten in place and dynamic entries get padded-layout ``strides``.
    inputs : dict of str to int
        Input name -> entry id of the graph's real inputs.
    sources : dict, optional
        :func:`data_dim_sources` of ``graph``, if the caller has it already.
    given : collection of str, optional
        Symbols whose values the caller sets with :meth:`set_given` instead of input shapes
        (a nested graph of runtime control flow takes them from its parent executor).
    """

    def __init__(self, graph: Any, tensors: Sequence[Any], inputs: Mapping[str, int],
                 sources: Mapping[str, tuple[int, int]] | None = None, given: Collection[str] = ()) -> None:
        assert graph.sym_shape is not None
        self.sym_shape: tuple[tuple[int | str, ...], ...] = graph.sym_shape
        self.ranges: dict[str, tuple[int, int]] = dict(graph.dim_ranges)
        self.max_shape = graph.shape
        self.tensors = tensors
        self.dynamic_eids = [e for e, dims in enumerate(self.sym_shape) if any(isinstance(d, str) for d in dims)]
        self._fn = sym.shape_function([self.sym_shape[e] for e in self.dynamic_eids])
        self.input_names = {e: n for n, e in inputs.items() if e in set(self.dynamic_eids)}
        #: data-dependent symbol -> (entry, dim) whose kernel writes its value
        self.sources = dict(sources) if sources is not None else data_dim_sources(graph)
        plain = {d for e in self.input_names for d in self.sym_shape[e] if isinstance(d, str) and d in self.ranges}
        self.given = frozenset(n for n in given if n in self.ranges)
        unbound = sorted(set(self.ranges) - plain - self.sources.keys() - self.given)
        if unbound:
            raise InputError(
                f"dynamic dimension(s) {unbound} are not a plain dimension of any input, so no input shape "
                "can give their value"
            )
        # The storage is planned for the upper bounds, which is where the shapes start.
        self.env: dict[str, int] = {n: hi for n, (_, hi) in self.ranges.items()}
        self.set_by: dict[str, str] = {}  # symbol -> input whose shape last gave its value
        self.input_shapes: dict[int, tuple[int, ...]] = {}  # dynamic input eid -> shape set
        self._applied: dict[str, int] | None = None
        self._dirty = True
        self._keep: list[Any] = []
        for e in self.dynamic_eids:
            t = tensors[e]
            strides = (ctypes.c_int64 * max(len(self.max_shape[e]), 1))(*max_strides(self.max_shape[e]))
            self._keep.append(strides)
            t.dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        self.apply()

    def take_data_dims(self, names: Sequence[str]) -> None:
        """After the kernels that decide ``names`` ran: read each value from the dim its kernel
        wrote, check it, and re-shape every entry downstream.

        Raises
        ------
        KernelError
            A kernel reported an extent outside the dim's declared range.
        """
        for name in names:
            eid, d = self.sources[name]
            value = int(self.tensors[eid].shape[d])
            lo, hi = self.ranges[name]
            if not lo <= value <= hi:
                from .errors import KernelError

                raise KernelError(f"data-dependent dimension {name!r} came out as {value}, outside its range "
                                  f"{lo}..{hi} (entry {eid}, dim {d})")
            self.env[name] = value
        if self.env != self._applied:
            self.apply()

    def set_given(self, values: Mapping[str, int]) -> None:
        """Take the values of the :attr:`given` symbols (every one of them) from ``values``.

        The caller checked them against the same ranges; the next :meth:`prepare` re-shapes the
        entries only when a value changed.
        """
        for name in self.given:
            if self.env[name] != values[name]:
                self.env[name] = int(values[name])
                self._dirty = True

    def is_dynamic(self, eid: int) -> bool:
        """Whether entry ``eid`` has a symbolic dim."""
        return any(isinstance(d, str) for d in self.sym_shape[eid])

    def dims(self, eid: int) -> tuple[int | str, ...]:
        """Entry ``eid``'s dims (ints and symbolic expressions)."""
        return self.sym_shape[eid]

    # ------------------------------------------------------------------ inputs
    def bind_input(self, name: str, eid: int, shape: Sequence[int]) -> None:
        """Take the symbols' values from input ``name`` of shape ``shape``.

        Raises
        ------
        InputError
            Wrong rank, a static dim that differs, a symbol outside its range, or one
            symbol given two values by this input's own dims.
        """
        dims = self.sym_shape[eid]
        shape = tuple(int(x) for x in shape)
        if len(shape) != len(dims):
            raise InputError(f"input {name!r}: shape {shape} has {len(shape)} dims, expected {len(dims)} "
                             f"{self._show(dims)}")
        new: dict[str, int] = {}
        for k, (d, a) in enumerate(zip(dims, shape)):
            if isinstance(d, int):
                if a != d:
                    raise InputError(f"input {name!r}: dim {k} is {a}, expected {d} (shape {self._show(dims)})")
            elif d in self.ranges:
                lo, hi = self.ranges[d]
                if not lo <= a <= hi:
                    raise InputError(f"input {name!r}: dim {k} ({d}) is {a}, outside its range {lo}..{hi}")
                if new.get(d, a) != a:
                    raise InputError(f"input {name!r}: dimension {d!r} is both {new[d]} and {a} in shape {shape}")
                new[d] = a
        env = dict(self.env, **new)
        for k, (d, a) in enumerate(zip(dims, shape)):
            if isinstance(d, str) and d not in self.ranges and sym.evaluate(d, env) != a:
                raise InputError(f"input {name!r}: dim {k} is {a}, but {d} = {sym.evaluate(d, env)} with "
                                 f"{self._values(sym.symbols(d), env)}")
        self.env = env
        for d in new:
            self.set_by[d] = name
        self.input_shapes[eid] = shape
        self._dirty = True

    def prepare(self) -> None:
        """Before a run: check every dynamic input against the symbols, apply new shapes.

        Raises
        ------
        InputError
            Two inputs disagree on a dimension (naming both and the dim).
        """
        if not self._dirty:
            return
        for eid, shape in self.input_shapes.items():
            want = tuple(d if isinstance(d, int) else sym.evaluate(d, self.env) for d in self.sym_shape[eid])
            if want != shape:
                name = self.input_names[eid]
                bad = [d for d, a, w in zip(self.sym_shape[eid], shape, want) if a != w]
                why = ", ".join(f"{d} = {sym.evaluate(d, self.env)} (from input "
                                f"{self.set_by.get(next(iter(sym.symbols(d))), '?')!r})"
                                for d in bad if isinstance(d, str))
                raise InputError(f"inconsistent input shapes: input {name!r} has shape {shape}, but {why} "
                                 f"makes it {want}")
        if self.env != self._applied:
            self.apply()
        self._dirty = False

    def apply(self) -> None:
        """Write every dynamic entry's actual shape into its DLTensor."""
        shapes = self._fn(self.env)
        self.actual: dict[int, tuple[int, ...]] = {}
        for e, shp in zip(self.dynamic_eids, shapes):
            arr = self.tensors[e].shape
            for k, v in enumerate(shp):
                arr[k] = v
            self.actual[e] = shp
        self._applied = dict(self.env)

    def shape(self, eid: int) -> tuple[int, ...]:
        """Entry ``eid``'s shape at the symbols' current values."""
        if eid in self.actual and self._applied == self.env:
            return self.actual[eid]
        return tuple(d if isinstance(d, int) else sym.evaluate(d, self.env) for d in self.sym_shape[eid])

    # ------------------------------------------------------------------ messages
    def _show(self, dims: Sequence[int | str]) -> str:
        return "(" + ", ".join(str(d) for d in dims) + ")"

    @staticmethod
    def _values(names: Any, env: Mapping[str, int]) -> str:
        return ", ".join(f"{n}={env[n]}" for n in sorted(names))
