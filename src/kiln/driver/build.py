"""``kiln.build``: graph IR -> ExecutorFactoryModule.

Pipeline::

    BindParams -> InferType -> FoldConstant -> Simplify -> FoldConstant -> DCE   (kiln.transform)
    -> FuseOps (opt_level >= 1; at 0 every op is its own group)              (transform.fuse)
    -> lower every unique group to a PrimFunc                                (driver.lower_graph)
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
    from ..transform import AlterConvLayout, default_pipeline

    trace = None
    if timer is not None and timer.debug:
        def trace(name: str, g: Graph, dt: float) -> None:
            print(f"[kiln.build]   pass {name}: {dt * 1e3:.1f} ms ({len(g.nodes)} nodes)",
                  file=sys.stderr)
    seq = default_pipeline(params, opt_level=opt_level)
    if target is not None:
        # the pipeline's layout pass knows no target; give it this build's
        seq.passes = [AlterConvLayout(target) if p.name == "AlterConvLayout" else p for p in seq.passes]
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
    originals = original_param_arrays(mod, params)
    # the blocked conv layout is tuned for CPU SIMD; GPU schedules want plain NCHW
    disabled = ("AlterConvLayout",) if dts.uses_accelerator else ()
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
    with timer.stage("codegen+compile"):
        if dts.uses_accelerator:
            lib = build_libraries(lowered, cdev, dts, _empty_lib)
        else:
            lib = codegen.build_module(lowered.funcs, dts.primary) if lowered.funcs else _empty_lib()
    with timer.stage("graph_codegen"):
        res = _graph_codegen(graph, lowered, originals, cdev)
    params_out: dict[str, Any] = dict(res.params)
    if link_params and params_out:
        from .linked_params import linked_params_module

        with timer.stage("link_params"):
            lib.import_module(linked_params_module(params_out, mod_name))
        params_out = {}
    with timer.stage("factory"):
        factory = ExecutorFactoryModule(json.dumps(res.graph), lib, params_out, mod_name)
    timer.times["total"] = time.perf_counter() - t_all
    if timer.debug:
        print(f"[kiln.build] total: {timer.times['total'] * 1e3:.1f} ms; "
              f"{res.memory_plan.summary()}", file=sys.stderr)
    stats = BuildStats(
        num_ops=sum(1 for n in graph.nodes if n.op != "constant"),
        num_groups=len(fused.groups),
        num_kernel_calls=sum(1 for c in lowered.calls if c.func_name != "__nop"),
        num_functions=len(lowered.funcs),
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
    return factory


def _graph_codegen(graph: Graph, lowered: LoweredModel, originals: Mapping[str, Any],
                   devices: list[int] | None = None) -> GraphCodegenResult:
    devs = devices if devices is not None else [1] * len(lowered.calls)
    calls = [KernelCall(c.func_name, c.args, c.outputs, device=d) for c, d in zip(lowered.calls, devs)]
    return generate_graph_json(graph, calls, originals)


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
