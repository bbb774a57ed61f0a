"""Executor-level control flow: the ``__if`` and ``__loop`` nodes of a graph JSON.

A control-flow node holds nested graphs (``docs/graph_json_format.md``, "Control flow"). For
each, the parent executor creates one sub-executor when it is created itself: the same library,
the same devices, a storage plan of its own. At run time the node runs from Python between the
parent's native segments (like ``__copy``); the nested graph's own kernels still run as native
segments of the sub-executor.

* **Arguments** of a nested graph are bound zero copy to the parent's entries before every run
  (the parent's entries may have been rebound since: zero-copy inputs, shared params). The
  reader checked that shapes and dtypes agree. A loop's iteration number and condition are
  written into the sub-executor's own memory.
* **Results** are copied into the parent's output entries: a nested head may be one of its
  arguments or share storage with other entries, so binding it zero copy would be unsafe.
* **Symbolic dims.** A nested graph with dynamic dims declares the parent's symbols with the
  same ranges (checked by the reader), so a dynamic argument or head has the same upper-bound
  storage and padded layout (the data in the sub-box ``[0:a0, 0:a1, ...]``) as the parent entry
  it pairs with: binding zero copy keeps every element in its place, and a copy (a result, a
  carried value, a snapshot) moves the valid sub-box only, so a small shape under large
  bounds does not pay for the whole buffer on every branch or iteration. Before a run the
  node hands the parent's current symbol values to the sub-executor, which re-shapes its
  entries only when one changed (:mod:`.dynamic_shapes`).
* A loop keeps its carried values in the parent's output entries: they are initialised from
  the node's initial inputs, the body reads them zero copy, and its results are copied back
  after every iteration (a result that is itself a body argument is snapshotted first, so a
  body that swaps two carried values stays correct).
* A loop's **scan outputs** (``num_scan``) are planned for the iteration count's upper bound
  (their leading dim is a data-dependent symbol, ``docs/dynamic_shapes.md``): iteration ``i``'s
  scan values are copied into row ``i``, and after the loop the count is written into the
  leading dim of each scan output's DLTensor, from which the parent executor takes the symbol's
  value (as after a kernel that reports an extent) and re-shapes every later entry. A loop that
  would run past the bound fails before writing past the planned rows.

Errors raised while a nested graph runs are re-raised as :class:`KernelError` naming the node,
its function and the branch (or body). CPU (host-visible) entries only.

Runtime layer: imports nothing from the compiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DeviceError, KernelError, KilnError

if TYPE_CHECKING:
    from .graph_executor import GraphExecutor
    from .graph_json import GraphNode

__all__ = ["make_control_runner"]


def _copy_valid(ex: "GraphExecutor", eid: int, dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst``, host arrays with entry ``eid``'s layout in ``ex``: the
    valid sub-box of a dynamic entry (at the symbols' current values), all of a static one."""
    dyn = ex.dyn
    if dyn is None or not dyn.is_dynamic(eid):
        dst.copyfrom(src)
        return
    box = tuple(slice(0, a) for a in dyn.shape(eid))
    dst.numpy(copy=False)[box] = src.numpy(copy=False)[box]


class _Nested:
    """One nested graph's executor and where its arguments and results live in the parent."""

    def __init__(self, parent: "GraphExecutor", node: "GraphNode", key: str, in_eids: tuple[int, ...]) -> None:
        from .graph_executor import GraphExecutor

        g = node.subgraphs[key]
        self.key = key
        self.arg_eids = [g.entry_id(n) for n in g.arg_nodes]
        self.head_eids = [g.entry_id(n, i) for n, i, _ in g.heads]
        params = list(node.attrs.get(f"{key}_params", []))
        self.n_decl = len(self.arg_eids) - len(params)
        # every argument is bound to a parent entry before a run, so its own memory is never
        # read: skip zero-filling it
        names = [g.nodes[n].name for n in g.arg_nodes]
        #: the parent's symbols this graph uses (all but the data-dependent dims it decides itself)
        self.given = sorted(set(g.dim_ranges) - g.data_dims)
        self.ex = GraphExecutor(g, parent.lib, parent.devices, prefilled=names, given_dims=self.given)
        for n in names:
            self.ex.mark_set(n)
        #: (nested arg entry, parent entry) of the nested graph's params
        self.param_pairs = [(self.arg_eids[self.n_decl + k], in_eids[i]) for k, i in enumerate(params)]
        roots = {self.ex.alias_root[e] for e in self.arg_eids}
        #: heads that are (views of) arguments: read before anything is written back
        self.head_is_arg = [self.ex.alias_root[h] in roots for h in self.head_eids]

    def bind(self, parent: "GraphExecutor", pairs: list[tuple[int, int]]) -> None:
        if self.given:
            assert parent.dyn is not None and self.ex.dyn is not None  # the reader matched the symbols
            self.ex.dyn.set_given(parent.dyn.env)
        arrays = self.ex.arrays
        for sub_eid, parent_eid in pairs:
            arr = parent.arrays[parent_eid]
            if arrays[sub_eid] is not arr:  # still bound from the last run: nothing to do
                self.ex.bind(sub_eid, arr)

    def results(self) -> list[Any]:
        """The nested heads, snapshotted where a head is an argument's memory."""
        out = []
        for h, snap in zip(self.head_eids, self.head_is_arg):
            a = self.ex.arrays[h]
            if snap:
                copy = _empty_like(a)
                _copy_valid(self.ex, h, copy, a)
                a = copy
            out.append(a)
        return out


def _empty_like(a: Any) -> Any:
    from .ndarray import empty

    return empty(a.shape, a.dtype, a.device)


def _scalar(arr: Any) -> Any:
    return np.asarray(arr.numpy()).reshape(-1)[0]


class _ControlNode:
    """Common state of an ``__if`` / ``__loop`` runner."""

    def __init__(self, parent: "GraphExecutor", nid: int, node: "GraphNode",
                 in_eids: tuple[int, ...], out_eids: tuple[int, ...]) -> None:
        self.parent = parent
        self.nid, self.name, self.func_name = nid, node.name, node.func_name
        self.in_eids, self.out_eids = in_eids, out_eids
        off = [e for e in in_eids + out_eids if not parent.entry_device[e].host_visible]
        if off:
            raise DeviceError(f"graph node {nid} ({node.name!r}): {node.func_name!r} runs on the CPU only; "
                              f"entry {off[0]} is on {parent.entry_device[off[0]]}")

    def _run(self, sub: _Nested) -> None:
        try:
            sub.ex.run()
        except KilnError as err:
            raise KernelError(f"graph node {self.nid} ({self.name!r}), function {self.func_name!r}, "
                              f"{sub.key}: {err}") from err


class _IfRunner(_ControlNode):
    def __init__(self, parent: "GraphExecutor", nid: int, node: "GraphNode",
                 in_eids: tuple[int, ...], out_eids: tuple[int, ...]) -> None:
        super().__init__(parent, nid, node, in_eids, out_eids)
        self.branches = [_Nested(parent, node, k, in_eids) for k in ("then_branch", "else_branch")]

    def __call__(self) -> None:
        p = self.parent
        sub = self.branches[0 if bool(_scalar(p.arrays[self.in_eids[0]])) else 1]
        sub.bind(p, [(sub.arg_eids[k], self.in_eids[1 + k]) for k in range(sub.n_decl)] + sub.param_pairs)
        self._run(sub)
        for o, r in zip(self.out_eids, sub.results()):
            _copy_valid(p, o, p.arrays[o], r)


class _LoopRunner(_ControlNode):
    def __init__(self, parent: "GraphExecutor", nid: int, node: "GraphNode",
                 in_eids: tuple[int, ...], out_eids: tuple[int, ...]) -> None:
        super().__init__(parent, nid, node, in_eids, out_eids)
        self.body = b = _Nested(parent, node, "body", in_eids)
        n_scan = int(node.attrs.get("num_scan", 0))
        n = len(out_eids) - n_scan
        self.n_carried = n
        self.carried_eids = out_eids[:n]
        # the scan outputs' host memory at the planned (upper-bound) shape: row i is iteration i
        self.scan_eids = out_eids[n:]
        self.scan_views: list[np.ndarray] = []
        for e in self.scan_eids:
            view = parent.host_view(e)
            assert view is not None  # CPU memory, checked above
            self.scan_views.append(view)
        self.max_iterations = parent.graph.shape[self.scan_eids[0]][0] if n_scan else None
        # carried state lives in the parent's outputs; captured values are the node's inputs
        self.pairs = ([(b.arg_eids[2 + k], out_eids[k]) for k in range(n)]
                      + [(b.arg_eids[2 + k], in_eids[2 + k]) for k in range(n, b.n_decl - 2)] + b.param_pairs)
        # the iteration number and condition: written into the body executor's own memory
        it_view, cond_view = b.ex.host_view(b.arg_eids[0]), b.ex.host_view(b.arg_eids[1])
        assert it_view is not None and cond_view is not None  # CPU memory, checked above
        self.it_view: np.ndarray = it_view
        self.cond_view: np.ndarray = cond_view

    def __call__(self) -> None:
        p, b = self.parent, self.body
        trip = int(_scalar(p.arrays[self.in_eids[0]]))
        cond = bool(_scalar(p.arrays[self.in_eids[1]]))
        n = self.n_carried
        for k, o in enumerate(self.carried_eids):
            _copy_valid(p, o, p.arrays[o], p.arrays[self.in_eids[2 + k]])
        b.bind(p, self.pairs)
        # the shapes hold for the whole loop (the body's symbols are the parent's), so the
        # valid boxes are NumPy views taken once: an iteration is one native run plus copies
        heads = [_valid_view(b.ex, h) for h in b.head_eids]
        cond_out = heads[0].reshape(-1)
        carried = [(_valid_view(p, o), heads[1 + k], b.head_is_arg[1 + k]) for k, o in enumerate(self.carried_eids)]
        scans = [(view, tuple(slice(0, a) for a in r.shape), r) for view, r in zip(self.scan_views, heads[1 + n:])]
        it = 0
        while cond and it < trip:
            if self.max_iterations is not None and it >= self.max_iterations:
                raise KernelError(
                    f"graph node {self.nid} ({self.name!r}), function {self.func_name!r}: the loop runs more than "
                    f"{self.max_iterations} iterations, the bound its scan outputs were planned for (the trip count "
                    "M known at import, else kiln.frontend.onnx.ops_control.RUNTIME_LOOP_MAX_ITERATIONS)")
            self.it_view[...] = it
            self.cond_view[...] = cond
            self._run(b)
            cond = bool(cond_out[0])
            # scan rows first: a scan head that is a carried argument's memory stacks the value
            # the iteration came in with, before the carried values are written back
            for view, box, r in scans:
                row: tuple[int | slice, ...] = (it, *box)  # view[it][box] would write a copy of a 0-d row
                view[row] = r  # a head is one row (checked when the graph is read)
            # a result that is an argument's memory is read whole before any carried value is written
            new = [r.copy() if snap else r for _, r, snap in carried]
            for (dst, _, _), r in zip(carried, new):
                dst[...] = r
            it += 1
        # the actual count, read by the parent like a kernel-reported extent (GraphExecutor.segments)
        for e in self.scan_eids:
            p.tensors[e].shape[0] = it


def _valid_view(ex: "GraphExecutor", eid: int) -> np.ndarray:
    """A NumPy view of entry ``eid``'s valid data in executor ``ex`` (host memory): the sub-box
    at the symbols' current values of a dynamic entry, all of a static one."""
    view = ex.arrays[eid].numpy(copy=False)
    if ex.dyn is None or not ex.dyn.is_dynamic(eid):
        return view
    return view[tuple(slice(0, a) for a in ex.dyn.shape(eid))]


_RUNNERS = {"__if": _IfRunner, "__loop": _LoopRunner}


def make_control_runner(parent: "GraphExecutor", nid: int, node: "GraphNode",
                        in_eids: tuple[int, ...], out_eids: tuple[int, ...]) -> Any:
    """The callable that runs control-flow node ``nid`` of ``parent`` once.

    Parameters
    ----------
    parent : GraphExecutor
        The executor the node belongs to (its storage is set up).
    nid : int
    node : GraphNode
        An ``__if`` or ``__loop`` node, its nested graphs validated by the reader.
    in_eids, out_eids : tuple of int
        The node's input and output entries in ``parent``.

    Returns
    -------
    callable
        ``runner()`` runs the node; it raises :class:`KernelError` naming the node and branch.
    """
    return _RUNNERS[node.func_name](parent, nid, node, in_eids, out_eids)
