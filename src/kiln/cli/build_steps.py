"""Compiling an ONNX model from the command line, stage by stage, for ``build``, ``bench`` and
``demo``.

Owns: the stages a build shows (:data:`BUILD_STAGES`), how ``kiln.build``'s ``progress``
events map onto them, and the import -> build -> export sequence with its timings. The
compiler is imported inside the functions, so importing this module costs nothing on a
deploy-only machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..runtime.errors import InputError, KilnFileNotFoundError
from .args import check_target
from .fmt import fmt_bytes
from .model_io import import_onnx
from .progress import Progress

__all__ = ["BUILD_STAGES", "BuildResult", "build_model", "run_build", "build_progress"]

#: The stages a build goes through, in order (what the progress display shows).
BUILD_STAGES = ("import", "optimize", "lower", "codegen+compile", "export")

#: driver stage (``kiln.build``'s ``progress`` callback) -> display stage
_DISPLAY_STAGE = {"passes": "optimize", "fuse": "optimize", "lower": "lower",
                  "codegen+compile": "codegen+compile", "graph_codegen": "codegen+compile",
                  "link_params": "codegen+compile", "factory": "codegen+compile"}


def build_progress(enabled: bool = True) -> Progress:
    """A :class:`~kiln.cli.progress.Progress` over :data:`BUILD_STAGES`."""
    return Progress(BUILD_STAGES, enabled=enabled)


def run_build(graph: Any, params: Mapping[str, Any], prog: Progress, **kwargs: Any) -> Any:
    """``kiln.build(graph, params=params, **kwargs)`` with live stages on ``prog``.

    Display stages: ``optimize`` (passes + fusion), ``lower`` (with a per-kernel counter),
    ``codegen+compile`` (kernel code generation, the C/LLVM compile, graph JSON and the
    factory). They follow the driver's ``progress`` callback; the driver's own per-stage
    times stay in ``factory.build_stats.timings``.
    """
    from .. import build as kiln_build

    lowered = {"n": 0, "total": 0}

    def on_progress(stage: str, event: str, info: dict) -> None:
        shown = _DISPLAY_STAGE.get(stage, stage)
        if event == "start" and prog.current != shown:
            prog.begin(shown)
        elif event == "kernel":
            lowered.update(n=info["index"], total=info["total"])
            prog.counter = f"group {info['index']}/{info['total']}"
        elif event == "end" and stage == "lower":
            prog.counter = ""
            prog.details["lower"] = f"{lowered['total']} fused groups"

    try:
        factory = kiln_build(graph, params=params, progress=on_progress, **kwargs)
    except BaseException:
        prog.abort()
        raise
    stats = getattr(factory, "build_stats", None)
    if stats is not None:
        prog.details["codegen+compile"] = f"{stats.num_functions} kernels"
    prog.end(None, prog.details.get(prog.current or "", ""))
    return factory


@dataclass
class BuildResult:
    """What :func:`build_model` produced."""

    factory: Any
    graph: Any
    params: dict[str, Any]
    progress: Progress
    path: str | None = None
    file_bytes: int | None = None
    ir_nodes: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: What was exported: ``factory``, or the IsaDispatchModule of a portable build.
    module: Any = None


def build_model(model_path: str, *, target: str = "llvm", shapes: Mapping[str, Sequence[int | str]] | None = None,
                dim_ranges: Mapping[str, tuple[int, int]] | None = None,
                opt_level: int = 3, link_params: bool = False, output: str | None = None,
                progress: Progress | None = None, tuning_log: str | None = None,
                params_file: str | None = None, isa_levels: Sequence[str] | None = None) -> BuildResult:
    """Import, compile and (optionally) export ``model_path``; drives the progress display.

    With ``params_file`` the weights are written there (``save_param_dict`` format) and the
    library is exported without them. With ``isa_levels`` (``["v4", "v3", "v2"]``) the model is
    built once per CPU level into one library that picks at load (:func:`kiln.build_portable`);
    ``res.factory`` is then the most demanding level's build and ``res.module`` what is exported.

    Stages ``import`` and ``export`` are timed here; the stages inside ``kiln.build`` come
    from :func:`run_build`.

    Raises
    ------
    KilnFileNotFoundError
        If the model, or the directory of ``output``, does not exist.
    KilnError
        Any error of the import or the build (unknown target, unsupported op, ...).
    """
    prog = progress or build_progress(enabled=False)
    check_target(target)
    with prog.stage("import"):
        graph, params = import_onnx(model_path, shapes, dim_ranges)
        nops = sum(1 for n in graph.nodes if n.op != "constant")
        prog.details["import"] = f"{nops} ops, {len(params)} params"

    extra: dict[str, Any] = {"tuning_log": tuning_log} if tuning_log else {}
    module: Any
    if isa_levels:
        from ..driver.portable import build_portable, level_targets
        from ..target import Target

        if params_file:
            raise InputError("--params-file cannot be combined with --isa-levels: each level's build lays "
                             "its weights out for its own kernels")
        base = Target(target).kind.name
        with prog.stage("codegen+compile"):
            module = build_portable(graph, params, targets=level_targets(isa_levels, base), opt_level=opt_level,
                                    link_params=link_params, **extra)
            prog.details["codegen+compile"] = f"{len(module.variants)} CPU levels"
        factory = module.factory(0)
    else:
        factory = module = run_build(graph, params, prog, target=target, opt_level=opt_level,
                                     link_params=link_params, **extra)
    res = BuildResult(factory, graph, params, prog, ir_nodes=len(graph.nodes))
    res.module = module
    if output:
        out_dir = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(out_dir):
            raise KilnFileNotFoundError(f"output directory does not exist: {out_dir}")
        with prog.stage("export"):
            if params_file:
                from ..runtime.params import save_param_dict_to_file

                save_param_dict_to_file(factory.get_params(), params_file)
                factory.remove_params().export_library(output)
            else:
                module.export_library(output)
            res.path = output
            res.file_bytes = os.path.getsize(output)
            prog.details["export"] = fmt_bytes(res.file_bytes)
    res.timings = dict(prog.timings)
    return res
