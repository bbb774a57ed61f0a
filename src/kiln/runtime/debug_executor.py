"""The debug executor: per-node timing, intermediate outputs, dumps and Chrome traces.

:class:`GraphModuleDebug` is a :class:`~kiln.runtime.graph_executor.GraphModule` whose
:meth:`~GraphModuleDebug.run` executes node by node (one native call per node instead of one
per graph), timing each node and copying each node's outputs to the host right after it
runs: the memory plan reuses storage, so an intermediate must be captured before a later
node overwrites it. It then writes the dumps to ``dump_root``. Timing numbers for the
whole model should come from :meth:`GraphModule.benchmark`, not from this class.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import InputError
from .graph_executor import GraphExecutor, GraphModule, _Op

__all__ = ["GraphModuleDebug", "ProfileReport", "ProfileRow", "create"]

_DUMP_DIR = "_kiln_debug"


@dataclass(frozen=True)
class ProfileRow:
    """Timing of one kernel node.

    Attributes
    ----------
    node_index, name, func_name
        Node id in the graph, node name, kernel function name.
    time_us : float
        Mean time per call in microseconds (mean over repeats).
    percent : float
        Share of the sum over all nodes.
    times_us : tuple of float
        One mean per repeat.
    input_shapes, output_shapes : tuple of tuple of int
    """

    node_index: int
    name: str
    func_name: str
    time_us: float
    percent: float
    times_us: tuple[float, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ProfileReport:
    """Per-node timing table; ``str(report)`` is a readable text table."""

    rows: tuple[ProfileRow, ...]
    number: int
    repeat: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        """Sum of the per-node mean times in microseconds."""
        return sum(r.time_us for r in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i: int) -> ProfileRow:
        return self.rows[i]

    def as_dicts(self) -> list[dict[str, Any]]:
        """Rows as plain dicts (for JSON or pandas)."""
        return [r.__dict__.copy() for r in self.rows]

    def table(self, sort: bool = False) -> str:
        """Text table; ``sort=True`` orders by time, slowest first."""
        rows = sorted(self.rows, key=lambda r: -r.time_us) if sort else list(self.rows)

        def shp(s: Sequence[tuple[int, ...]]) -> str:
            return ", ".join(str(list(x)) for x in s)

        head = ("Node", "Op", "Time (us)", "%", "Inputs", "Outputs")
        body = [
            (r.name, r.func_name, f"{r.time_us:.3f}", f"{r.percent:.2f}", shp(r.input_shapes), shp(r.output_shapes))
            for r in rows
        ]
        body.append(("Total", "", f"{self.total_us:.3f}", "100.00" if rows else "0", "", ""))
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        def fmt(cells: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) if i in (0, 1, 4, 5) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths)))

        lines = [fmt(head), "  ".join("-" * w for w in widths)]
        lines += [fmt(b) for b in body[:-1]]
        lines += ["  ".join("-" * w for w in widths), fmt(body[-1])]
        lines.append(f"({len(rows)} kernel nodes, number={self.number}, repeat={self.repeat})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120] or "node"


class GraphModuleDebug(GraphModule):
    """A :class:`GraphModule` that can time nodes, expose intermediates and dump them.

    Parameters
    ----------
    module : GraphExecutor or GraphModule
    dump_root : str, optional
        Directory for :meth:`run` dumps (created if needed). Default: a new temporary one,
        removed when this module is freed (give a directory to keep the dumps). Dumps go to
        ``<dump_root>/_kiln_debug/``.
    """

    def __init__(self, module: Any, dump_root: str | os.PathLike | None = None) -> None:
        super().__init__(module)
        if dump_root is None:
            # ours, so removed with this module: every run() writes each node's outputs there
            # (gigabytes for a large model), and a script making many modules would fill /tmp
            dump_root = tempfile.mkdtemp(prefix="kiln_debug_")
            weakref.finalize(self, shutil.rmtree, dump_root, ignore_errors=True)
        self.dump_root = os.fspath(dump_root)
        self._node_outputs: dict[int, list[np.ndarray]] = {}
        self._last_times: dict[int, tuple[float, float]] = {}  # nid -> (start s, duration s)
        self._op_fns = {op.nid: self.module.op_callable(op) for op in self.module.ops}

    # ---- helpers -------------------------------------------------------------------------------
    @property
    def dump_dir(self) -> str:
        """Where :meth:`run` writes its dumps."""
        return os.path.join(self.dump_root, _DUMP_DIR)

    def _shapes(self, op: _Op) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        ex = self.module

        def shape(e: int) -> tuple[int, ...]:  # the actual shape of a dynamic graph's entry
            return ex.dyn.shape(e) if ex.dyn is not None else ex.graph.shape[e]

        return tuple(shape(e) for e in op.in_eids), tuple(shape(e) for e in op.out_eids)

    def _run_by_node(self, capture: bool) -> float:
        """Run every node separately, timing each; capture outputs to host if asked."""
        ex = self.module
        ex.require_inputs()
        if ex.dyn is not None:
            ex.dyn.prepare()  # this run's shapes, as GraphExecutor.run applies them
        self._last_times = {}
        if capture:
            # Inputs too, as they were when this run started (debug_get_output shows them).
            g = ex.graph
            self._node_outputs = {nid: [ex.arrays[g.entry_id(nid)].numpy()] for nid in g.arg_nodes}
        clock = time.perf_counter
        t_start = clock()
        for op in ex.ops:
            f = self._op_fns[op.nid]
            t0 = clock()
            f()
            t1 = clock()
            if op.nid in ex.decided_by:
                ex._take_data_dims(ex.decided_by[op.nid])
            self._last_times[op.nid] = (t0 - t_start, t1 - t0)
            if capture:
                self._node_outputs[op.nid] = [ex.arrays[e].numpy() for e in op.out_eids]
        return clock() - t_start

    # ---- API -------------------------------------------------------------------------------
    def run(self, **inputs: Any) -> None:
        """Run node by node, capture every node's outputs, and write the dumps.

        Writes into ``<dump_root>/_kiln_debug/``: ``graph.json`` (the graph JSON),
        ``<node index>_<node name>_out<k>.npy`` per node output, ``output_tensors.params``
        (all node outputs, named ``<node name>:<k>``, in the params format) and
        ``trace.json`` (Chrome trace of this run).
        """
        if inputs:
            self.set_input(**inputs)
        self._run_by_node(capture=True)
        self._write_dumps()

    def _write_dumps(self) -> None:
        from . import ndarray as nd
        from .params import save_param_dict

        g = self.module.graph
        d = self.dump_dir
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "graph.json"), "w", encoding="utf-8") as f:
            f.write(g.json_text)
        tensors = {}
        for nid, outs in self._node_outputs.items():
            if not g.nodes[nid].is_op:
                continue
            name = g.nodes[nid].name
            for k, a in enumerate(outs):
                np.save(os.path.join(d, f"{nid:04d}_{_safe(name)}_out{k}.npy"), a)
                tensors[f"{name}:{k}"] = nd.array(a)
        with open(os.path.join(d, "output_tensors.params"), "wb") as f:
            f.write(save_param_dict(tensors))
        self._write_trace(os.path.join(d, "trace.json"))

    def debug_get_output(self, node: str | int, out: Any = None, index: int = 0) -> Any:
        """Output ``index`` of any node (by name or node index) from the last debug run.

        Runs the graph node by node first if no debug run has happened yet. For an input or
        param node, returns its value at the start of that run.

        Returns
        -------
        NDArray
            A copy (or ``out``, filled).
        """
        from . import ndarray as nd

        g = self.module.graph
        if isinstance(node, str):
            matches = [i for i, n in enumerate(g.nodes) if n.name == node]
            if not matches:
                raise InputError(f"debug_get_output: no node named {node!r}")
            nid = matches[0]
        elif isinstance(node, (int, np.integer)) and 0 <= int(node) < len(g.nodes):
            nid = int(node)
        else:
            raise InputError(
                f"debug_get_output: node must be a name or an index in 0..{len(g.nodes) - 1}, got {node!r}"
            )
        n_out = g.node_row_ptr[nid + 1] - g.node_row_ptr[nid]
        if not 0 <= index < n_out:
            raise InputError(f"debug_get_output: node {g.nodes[nid].name!r} has {n_out} output(s), asked for {index}")
        if nid not in self._node_outputs:
            self._run_by_node(capture=True)
        value = self._node_outputs[nid][index]
        arr = nd.array(value, device=self.module.entry_device[g.entry_id(nid, index)])
        if out is None:
            return arr
        return self._copy_out(arr, out, f"node {g.nodes[nid].name!r} output {index}")

    def run_individual(self, number: int = 10, repeat: int = 1, min_repeat_ms: float = 0) -> ProfileReport:
        """Time every kernel node on its own.

        Each node's kernel is called ``number`` times back to back (natively, in one foreign
        call, for library kernels) per repeat; ``number`` grows until one repeat lasts
        ``min_repeat_ms``. Inputs are whatever is set now (the graph is run once first so
        every intermediate holds real data).

        Returns
        -------
        ProfileReport
            One row per kernel (``tvm_op``) node, in graph order; ``str()`` prints a table.
        """
        ex = self.module
        number = max(1, int(number))
        repeat = max(1, int(repeat))
        self._run_by_node(capture=False)
        clock = time.perf_counter
        means: dict[int, list[float]] = {}
        for op in ex.ops:
            n = number
            fn = ex.op_repeater(op, n)
            fn()  # warm-up (page faults, caches)
            per: list[float] = []
            for _ in range(repeat):
                while True:
                    t0 = clock()
                    fn()
                    el = clock() - t0
                    if min_repeat_ms <= 0 or el * 1e3 >= min_repeat_ms or op.kind == "nop":
                        break
                    n = max(int(n * 1.618) + 1, int(n * min_repeat_ms / 1e3 / max(el, 1e-9)) + 1)
                    fn = ex.op_repeater(op, n)
                per.append(el / n * 1e6)
            means[op.nid] = per
        total = sum(statistics.fmean(v) for v in means.values()) or 1.0
        rows = []
        for op in ex.ops:
            ins, outs = self._shapes(op)
            m = statistics.fmean(means[op.nid])
            rows.append(
                ProfileRow(op.nid, op.name, op.func_name, m, 100.0 * m / total, tuple(means[op.nid]), ins, outs)
            )
        return ProfileReport(tuple(rows), number, repeat)

    def profile(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0) -> ProfileReport:
        """Per-node timing table (:meth:`run_individual` with profiling defaults)."""
        return self.run_individual(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def _trace_events(self) -> list[dict[str, Any]]:
        ex = self.module
        events = []
        for op in ex.ops:
            start, dur = self._last_times[op.nid]
            ins, outs = self._shapes(op)
            events.append(
                {
                    "name": op.name,
                    "cat": op.func_name,
                    "ph": "X",
                    "ts": start * 1e6,
                    "dur": dur * 1e6,
                    "pid": 0,
                    "tid": 0,
                    "args": {
                        "node_index": op.nid,
                        "func_name": op.func_name,
                        "input_shapes": [list(s) for s in ins],
                        "output_shapes": [list(s) for s in outs],
                    },
                }
            )
        return events

    def _write_trace(self, path: str) -> None:
        trace = {"traceEvents": self._trace_events(), "displayTimeUnit": "ms", "otherData": {"producer": "kiln"}}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f, indent=1)

    def dump_chrome_trace(self, path: str | os.PathLike) -> str:
        """Run once node by node and write a Chrome-trace JSON (``chrome://tracing``, Perfetto).

        One complete event (``"ph": "X"``, ``ts``/``dur`` in microseconds) per kernel node.

        Returns
        -------
        str
            ``path``.
        """
        self._run_by_node(capture=False)
        path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._write_trace(path)
        return path


def create(
    graph_json: str | Mapping[str, Any], lib: Any, dump_root: str | os.PathLike | None, *devices: Any
) -> GraphModuleDebug:
    """Create a :class:`GraphModuleDebug` (TVM's ``debug_executor.create``).

    Parameters
    ----------
    graph_json : str or dict
    lib : Module
    dump_root : str or None
        Dump directory (None: a new temporary directory).
    *devices : Device
    """
    if len(devices) == 1 and isinstance(devices[0], (list, tuple)):
        devices = tuple(devices[0])
    return GraphModuleDebug(GraphExecutor(graph_json, lib, devices), dump_root=dump_root)
