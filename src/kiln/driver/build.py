"""``kiln.build``: graph IR -> ExecutorFactoryModule.

Pipeline::

    BindParams -> InferType -> FoldConstant -> Simplify -> FoldConstant -> DCE   (kiln.transform)
    -> FuseOps (opt_level >= 1; at 0 every op is its own group)              (transform.fuse)
    -> lower every unique group to a PrimFunc                                (driver.lower_graph)
    -> compile the subgraphs of runtime control flow the same way, recursively   (_compile_control)
    -> kiln.codegen.build_module(funcs, target)                              (kernel library)
    -> graph JSON + params + memory plan                                     (driver.graph_codegen)
    -> ExecutorFactoryModule(graph_json, lib, params, mod_name)

``KILN_DEBUG=1`` in the environment prints the time of every stage to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..ir import Graph
from ..runtime.errors import InputError
from ..transform.fuse import FusedGraph, fuse_ops
from ..transform.memory_plan import MemoryPlan
from .graph_codegen import GraphCodegenResult, KernelCall, generate_graph_json, original_param_arrays
from .lower_graph import LoweredModel, lower_fused_graph

__all__ = ["build", "lower", "optimize", "BuildStats"]


@dataclass
class BuildStats:
    """What a build did (``factory.get_stats()`` returns its :meth:`as_dict`).

    Attributes
    ----------
    num_ops : int
        Ops in the optimized graph (constants excluded).
    num_groups : int
        Fused groups (kernel calls plus ``__nop`` aliases).
    num_kernel_calls : int
    num_functions : int
        Distinct kernels in the library (identical groups share one).
    memory_plan : MemoryPlan
    timings : dict of str to float
        Seconds per stage.
    """

    num_ops: int
    num_groups: int
    num_kernel_calls: int
    num_functions: int
    memory_plan: MemoryPlan
    timings: dict[str, float] = field(default_factory=dict)
    linked_params: bool = False
    #: Distinct kernels whose schedule used a config from the tuning log.
    tuned_kernels: int = 0
    #: Convolutions whose channel block came from the tuning log.
    tuned_layouts: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serializable)."""
        return {"num_ops": self.num_ops, "num_groups": self.num_groups,
                "num_kernel_calls": self.num_kernel_calls, "num_functions": self.num_functions,
                "memory": self.memory_plan.as_dict(), "timings": dict(self.timings),
                "linked_params": self.linked_params, "tuned_kernels": self.tuned_kernels,
                "tuned_layouts": self.tuned_layouts}


#: ``progress(stage, event, info)`` — see :func:`build`.
ProgressCallback = Callable[[str, str, dict], None]


class _Timer:
    """Collects stage timings; prints them when ``KILN_DEBUG`` is set; reports to ``progress``."""

    def __init__(self, progress: ProgressCallback | None = None) -> None:
        self.debug = os.environ.get("KILN_DEBUG", "") not in ("", "0")
        self.times: dict[str, float] = {}
        self.progress = progress

    def report(self, stage: str, event: str, **info: Any) -> None:
        if self.progress is not None:
            self.progress(stage, event, info)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self.report(name, "start")
        ok = False
        try:
            yield
            ok = True
        finally:
            dt = time.perf_counter() - t0
            self.times[name] = self.times.get(name, 0.0) + dt
            if self.debug:
                print(f"[kiln.build] {name}: {dt * 1e3:.1f} ms", file=sys.stderr)
            if ok:
                self.report(name, "end", seconds=dt)


def _as_target(target: Any) -> Any:
    from ..target import Target

    if target is None:
        target = "llvm"
    return target if isinstance(target, Target) else Target(target)


def _check_graph(mod: Any) -> Graph:
    if not isinstance(mod, Graph):
        raise InputError(f"kiln.build expects a kiln.ir.Graph (IRModule), got {type(mod).__name__}; "
                         "use kiln.frontend.from_onnx(...) to import a model")
    return mod


def optimize(mod: Graph, params: Mapping[str, Any] | None = None, opt_level: int = 3,
             timer: _Timer | None = None, disabled: tuple[str, ...] = (), target: Any = None) -> Graph:
    """Run the graph pass pipeline (bind params, infer types, fold, simplify).

    Parameters
    ----------
    mod : Graph
    params : dict of str to array, optional
        Bound as constants (graph inputs of these names disappear).
    opt_level : int
        Pipeline level (TVM convention).
    target : Target, optional
        The CPU target the graph is built for: the layout pass blocks channels for its vector
        width (None: the schedules' no-target ISA, x86-64-v3).

    Returns
    -------
    Graph
    """
    from ..transform import AlterConvLayout, PackDenseWeights, default_pipeline

    trace = None
    if timer is not None and timer.debug:
        def trace(name: str, g: Graph, dt: float) -> None:
            print(f"[kiln.build]   pass {name}: {dt * 1e3:.1f} ms ({len(g.nodes)} nodes)",
                  file=sys.stderr)
    seq = default_pipeline(params, opt_level=opt_level)
    if target is not None:
        # the pipeline's layout passes know no target; give them this build's
        targeted = {"AlterConvLayout": AlterConvLayout, "PackDenseWeights": PackDenseWeights}
        seq.passes = [targeted[p.name](target) if p.name in targeted else p for p in seq.passes]
    seq.disabled |= set(disabled)
    if trace is not None:
        seq.trace = trace
    return seq(_check_graph(mod))


def lower(mod: Graph, target: Any = "llvm", params: Mapping[str, Any] | None = None,
          mod_name: str = "default", opt_level: int = 3) -> LoweredModel:
    """Optimize, fuse and lower without generating code — for debugging.

    ``print(kiln.driver.lower(mod, "llvm"))`` shows the fused groups, which kernel each
    group calls, and every kernel's loop IR.

    Returns
    -------
    LoweredModel
        ``.fused`` (groups), ``.calls``, ``.funcs`` (PrimFuncs); ``.dump()`` is the listing.
    """
    tgt = _as_target(target)
    graph = optimize(mod, params, opt_level, target=tgt)
    fused = fuse_ops(graph, opt_level=opt_level)
    return lower_fused_graph(fused, tgt, mod_name)


def build(mod: Graph, target: Any = "llvm", params: Mapping[str, Any] | None = None,
          mod_name: str = "default", link_params: bool = False, opt_level: int = 3,
          progress: ProgressCallback | None = None, placement: Any = None, tuning_log: Any = None) -> Any:
    """Compile a graph into an :class:`~kiln.runtime.ExecutorFactoryModule`.

    Parameters
    ----------
    mod : Graph
        The model (e.g. from :func:`kiln.frontend.from_onnx`).
    target : str, dict or Target
        ``"llvm"``, ``"llvm -mcpu=native"``, ``"c"``, ``{"kind": "c"}``, ``"opencl"``...; or a
        dict device name -> target for a heterogeneous build, e.g.
        ``{"cpu": "llvm", "opencl": "opencl"}`` (the first entry is the default device).
        See :mod:`kiln.driver.placement`.
    params : dict of str to array, optional
        Weights, keyed by graph input name; bound as constants and optimized with the graph.
    mod_name : str
        Name of the executor creation function (``factory[mod_name](dev)``) and part of every
        kernel name (``kilngen_<mod_name>_fused_...``).
    link_params : bool
        Put the weights into the kernel library (an extra C data module compiled into the same
        shared library) instead of the factory's params blob. See :mod:`kiln.driver.linked_params`.
    opt_level : int
        0: no fusion, no folding; 1: fusion; 2+: folding, CSE and simplification too.
    placement : dict or callable, optional
        Node name or op name -> device (``{"add": "opencl", "log": "cpu"}``), or
        ``f(node) -> device or None``. Values crossing devices get ``__copy`` nodes and the
        graph JSON a ``device_index``; create the executor with every device used
        (``factory["default"](kiln.cpu(), kiln.opencl())``).
    progress : callable, optional
        ``progress(stage, event, info)`` is called as the build goes: ``event`` is ``"start"``
        or ``"end"`` (``info["seconds"]``) for each stage (``passes``, ``fuse``, ``lower``,
        ``codegen+compile``, ``graph_codegen``, ``link_params``, ``factory``), and
        ``"kernel"`` during ``lower`` with ``info`` = ``{"index", "total", "name"}`` after each
        fused group. Used by ``kiln build`` to draw its progress display.
    tuning_log : str, os.PathLike or iterable of TuningRecord, optional
        A log written by :func:`kiln.autotune.tune` (``kiln tune``): every kernel whose
        workload has a valid record for this target (same kind and ``-mcpu``) uses the
        recorded config with the smallest median time instead of the default. ``get_stats()["tuned_kernels"]``
        counts them. See ``docs/tuning.md``.

    Returns
    -------
    ExecutorFactoryModule
        ``graph_json, lib, params = kiln.build(...)`` unpacks; ``factory.memory_plan`` is the
        :class:`~kiln.transform.memory_plan.MemoryPlan`, ``factory.get_stats()`` a summary.

    Examples
    --------
    >>> factory = kiln.build(mod, target="llvm", params=params)
    >>> m = kiln.GraphModule(factory["default"](kiln.cpu()))
    >>> m.set_input("data", x); m.run(); y = m.get_output(0).numpy()
    """
    from .. import codegen
    from ..runtime.executor_factory import ExecutorFactoryModule

    from .placement import build_libraries, lower_placed, place_groups, resolve_targets

    timer = _Timer(progress)
    t_all = time.perf_counter()
    dts = resolve_targets(target)
    _check_graph(mod)
    _prepare_export(dts)
    originals = original_param_arrays(mod, params)
    # the blocked conv layout is tuned for CPU SIMD; GPU schedules want plain NCHW
    disabled = ("AlterConvLayout", "PackDenseWeights") if dts.uses_accelerator else ()
    tuning = _tuning_context(tuning_log, dts.primary)
    tuned = {"kernels": 0, "hits": 0, "layouts": 0}

    def on_kernel(i: int, n: int, name: str) -> None:
        # a kernel is tuned when its lowering looked up a logged config
        if tuning is not None and tuning.hits > tuned["hits"]:
            tuned["kernels"] += 1
            tuned["hits"] = tuning.hits
        timer.report("lower", "kernel", index=i, total=n, name=name)

    with tuning if tuning is not None else _no_context():
        with timer.stage("passes"):
            graph = optimize(mod, params, opt_level, timer, disabled, target=dts.primary)
        if tuning is not None:
            tuned["layouts"] = tuned["hits"] = tuning.hits
        with timer.stage("fuse"):
            fused = fuse_ops(graph, opt_level=opt_level)
            fused, gdev = place_groups(fused, placement, dts)
        with timer.stage("lower"):
            lowered, cdev = lower_placed(fused, gdev, dts, mod_name, on_kernel=on_kernel)
            sub_funcs, control = _compile_control(lowered, dts.primary, mod_name, opt_level, disabled)
    if control and dts.uses_accelerator:
        raise InputError("runtime control flow (an If / Loop decided at run time) is built for a single "
                         "CPU target only for now")
    funcs = lowered.funcs + sub_funcs
    with timer.stage("codegen+compile"):
        if dts.uses_accelerator:
            lib = build_libraries(lowered, cdev, dts, _empty_lib)
        else:
            lib = codegen.build_module(funcs, dts.primary) if funcs else _empty_lib()
    with timer.stage("graph_codegen"):
        res = _graph_codegen(graph, lowered, originals, cdev, control)
    params_out: dict[str, Any] = dict(res.params)
    # text has no byte layout to link into a library: string params stay in the params blob
    linkable = {k: v for k, v in params_out.items() if np.asarray(v).dtype != object} if link_params else {}
    if linkable:
        from .linked_params import linked_params_module

        with timer.stage("link_params"):
            lib.import_module(linked_params_module(linkable, mod_name))
        params_out = {k: v for k, v in params_out.items() if k not in linkable}
    layouts = getattr(mod, "value_layouts", None)
    if layouts:  # sequence / optional inputs and outputs, flattened by the frontend (docs/sequences.md)
        res.graph["kiln_values"] = layouts
    with timer.stage("factory"):
        factory = ExecutorFactoryModule(json.dumps(res.graph), lib, params_out, mod_name)
    timer.times["total"] = time.perf_counter() - t_all
    if timer.debug:
        print(f"[kiln.build] total: {timer.times['total'] * 1e3:.1f} ms; "
              f"{res.memory_plan.summary()}", file=sys.stderr)
    stats = BuildStats(
        num_ops=sum(1 for n in graph.nodes if n.op != "constant"),
        num_groups=len(fused.groups),
        num_kernel_calls=sum(1 for c in lowered.calls if c.func_name not in ("__nop", "__concat")),
        num_functions=len(funcs),
        memory_plan=res.memory_plan,
        timings=dict(timer.times),
        linked_params=bool(link_params and res.params),
        tuned_kernels=tuned["kernels"],
        tuned_layouts=tuned["layouts"],
    )
    # Build metadata rides on the factory instance (the runtime class stays compiler-free).
    factory.memory_plan = res.memory_plan
    factory.build_stats = stats
    factory.lowered = lowered
    factory.get_stats = stats.as_dict
    # export_library: the crt / C API objects come from the on-disk compile cache
    factory.export_object_cache = codegen.cache.cached_object
    return factory


def _prepare_export(dts: Any) -> None:
    """Have the objects an export of this build links compiled while the build runs.

    Only for a library for this machine from the ``llvm`` codegen (whose modules add no
    compile options), and only with the on-disk cache, so that the objects outlive the
    process: a build that is never exported then costs one background compile per cache.
    """
    from .. import codegen
    from ..runtime.export import prepare_export_objects

    t = dts.primary
    if dts.uses_accelerator or t.kind.name != "llvm" or t.attrs.get("mtriple") or not codegen.cache.cache_enabled():
        return
    prepare_export_objects(codegen.cache.cached_object)


def _graph_codegen(graph: Graph, lowered: LoweredModel, originals: Mapping[str, Any],
                   devices: list[int] | None = None,
                   control: Mapping[int, tuple[dict[str, Any], list[Any]]] | None = None) -> GraphCodegenResult:
    devs = devices if devices is not None else [1] * len(lowered.calls)
    control = control or {}
    calls = []
    for i, (c, d) in enumerate(zip(lowered.calls, devs)):
        if i in control:
            # a control-flow node keeps its model name: run-time errors name it
            attrs, extra = control[i]
            calls.append(KernelCall(c.func_name, list(c.args) + extra, c.outputs,
                                    c.group.nodes[0].name or "", d, attrs))
        elif c.func_name == "__host":
            from ..ir.ops.strings import host_attrs

            node = c.group.nodes[0]
            calls.append(KernelCall(c.func_name, c.args, c.outputs, node.name or "", d,
                                    host_attrs(node.op, node.attrs)))
        else:
            calls.append(KernelCall(c.func_name, c.args, c.outputs, device=d))
    return generate_graph_json(graph, calls, originals)


#: Per reserved control-flow function, the op attributes holding its subgraphs (graph-JSON order).
_SUBGRAPH_ATTRS = {"__if": ("then_branch", "else_branch"), "__loop": ("body",)}


def _compile_control(lowered: LoweredModel, target: Any, mod_name: str, opt_level: int,
                     disabled: tuple[str, ...], depth: int = 0
                     ) -> tuple[list[Any], dict[int, tuple[dict[str, Any], list[Any]]]]:
    """Compile the subgraphs of every ``__if`` / ``__loop`` call of ``lowered``, recursively.

    Each subgraph goes through the same pipeline (passes, fusion, lowering) with its own
    ``mod_name`` (``<mod_name>_if3_then``: the kernels of one library stay uniquely named)
    and becomes a nested graph JSON (``docs/graph_json_format.md``, "Control flow"). Its
    constants are not params of its own: they become extra inputs of the control node, so the
    parent's params blob (or linked params) holds every weight, and the node's
    ``<attr>_params`` lists which node inputs feed the nested graph's param nodes.

    Returns
    -------
    funcs : list of PrimFunc
        The subgraphs' kernels.
    control : dict
        Call index -> (extra node attributes, extra constant inputs of the node).
    """
    from ..runtime.graph_json import MAX_NESTING

    funcs: list[Any] = []
    control: dict[int, tuple[dict[str, Any], list[Any]]] = {}
    for i, c in enumerate(lowered.calls):
        keys = _SUBGRAPH_ATTRS.get(c.func_name)
        if keys is None:
            continue
        node = c.group.nodes[0]
        if depth >= MAX_NESTING:
            raise InputError(f"{node.op} node {node.name!r}: control flow is nested more than {MAX_NESTING} "
                             "levels deep, more than the graph JSON allows")
        attrs: dict[str, Any] = {}
        extra: list[Any] = []
        for key in keys:
            sub = node.attrs[key].graph
            tag = f"{mod_name}_{c.func_name.strip('_')}{i}_{key.split('_')[0]}"
            g = optimize(sub, None, opt_level, None, disabled, target=target)
            _keep_used_dims(g)
            low = lower_fused_graph(fuse_ops(g, opt_level=opt_level), target, tag)
            inner_funcs, inner = _compile_control(low, target, tag, opt_level, disabled, depth + 1)
            funcs += low.funcs + inner_funcs
            res = _graph_codegen(g, low, {}, None, inner)
            by_eid = {e: v for v, e in res.value_entry.items()}
            row_ptr = res.graph["node_row_ptr"]
            params = [by_eid[row_ptr[n]] for n in res.graph["arg_nodes"][len(g.inputs):]]
            first = len(c.args) + len(extra)
            attrs[key] = res.graph
            attrs[f"{key}_params"] = list(range(first, first + len(params)))
            extra += params
        if c.func_name == "__loop":
            attrs["num_carried"] = str(node.attrs["num_carried"])
            if node.attrs.get("num_scan"):  # absent when 0: such graphs stay readable by older runtimes
                attrs["num_scan"] = str(node.attrs["num_scan"])
        control[i] = (attrs, extra)
    return funcs, control


def _keep_used_dims(g: Graph) -> None:
    """Drop the symbols a subgraph declares (copied from its enclosing graph) but never uses.

    Its graph JSON lists only the symbols of its own entries, all given by the parent executor
    at run time; an unused data-dependent one of the parent would otherwise claim a kernel of
    the nested graph decides it.
    """
    from ..runtime import sym

    used = {n for v in list(g.inputs) + [o for node in g.nodes for o in node.outputs]
            for n in sym.dims_symbols(v.type.dims)}
    g.dim_ranges = {n: r for n, r in g.dim_ranges.items() if n in used}
    g.data_dims = {n for n in g.data_dims if n in used}


def _tuning_context(tuning_log: Any, target: Any) -> Any:
    """The :class:`~kiln.autotune.space.DispatchContext` of a tuning log, or None."""
    if tuning_log is None:
        return None
    from ..topi.tuning_log import apply_history_best

    return apply_history_best(tuning_log, target)


@contextmanager
def _no_context() -> Iterator[None]:
    yield


def _empty_lib() -> Any:
    """A kernel library with no kernels (a graph of only aliases / pass-through outputs)."""
    from ..runtime.csource import csource_module

    return csource_module("#include <kiln/c_runtime_api.h>\n", [])


def fuse(mod: Graph, params: Mapping[str, Any] | None = None, opt_level: int = 3) -> FusedGraph:
    """Optimize and fuse only; ``print(kiln.driver.fuse(mod))`` lists the groups."""
    return fuse_ops(optimize(mod, params, opt_level), opt_level=opt_level)
