"""Graph-level passes. A pass is a callable Graph -> Graph (see :class:`Pass`).

Provided here: ``InferType``, ``FoldConstant``, ``BindParams``, ``SimplifyInference``,
``RemoveIdentity``, ``EliminateCommonSubexpr``, ``DeadCodeElimination``, ``MarkAlias``,
``Simplify``, ``FusePatterns``, ``FlattenMatmul``, ``PruneConvTaps`` (constructors returning
:class:`Pass` objects) and their function forms.
Operator fusion (``kiln.transform.fuse``) and memory planning (``kiln.transform.memory_plan``)
are separate modules imported explicitly by the build driver — not from this ``__init__``.

Typical pipeline (what the build driver runs)::

    seq = Sequential([BindParams(params), InferType(), FoldConstant(), Simplify(), FoldConstant()],
                     opt_level=3)
    graph = seq(graph)
"""

from .pipeline import Pass, Sequential, graph_pass
from .alter_layout import AlterConvLayout, alter_conv_layout
from .pack_dense import PackDenseWeights, pack_dense_weights
from .infer_type import InferType, infer_type
from .flatten_matmul import FlattenMatmul, flatten_matmul
from .prune_conv_taps import PruneConvTaps, prune_conv_taps
from .fuse_patterns import FusePatterns, fuse_patterns
from .fold_constant import (BindParams, DEFAULT_FOLD_LIMIT, FoldConstant, bind_params,
                            fold_constant)
from .simplify import (DeadCodeElimination, EliminateCommonSubexpr, MarkAlias, RemoveIdentity,
                       Simplify, SimplifyInference, dead_code_elimination,
                       eliminate_common_subexpr, mark_alias, remove_identity, simplify,
                       simplify_inference)


def default_pipeline(params=None, opt_level: int = 2, disabled=()) -> Sequential:
    """The standard graph pipeline: bind params, infer types, fold, simplify, fuse RMSNorm /
    tanh-GELU chains into their ops, flatten shared-weight products over leading dims, prune
    conv taps that read only padding, fold again, and (opt_level 3) run conv chains in the
    blocked layout and store dense weights as their kernels' panels; ``disabled`` names passes
    to skip."""
    passes = []
    if params:
        passes.append(BindParams(params))
    passes += [InferType(), FoldConstant(), Simplify(opt_level), FusePatterns(), FlattenMatmul(),
               PruneConvTaps(), FoldConstant(), AlterConvLayout(), PackDenseWeights(), DeadCodeElimination()]
    return Sequential(passes, opt_level=opt_level, disabled=disabled, name="default_pipeline")


__all__ = [
    "Pass", "Sequential", "graph_pass", "default_pipeline", "AlterConvLayout", "alter_conv_layout",
    "PackDenseWeights", "pack_dense_weights",
    "FlattenMatmul", "flatten_matmul", "PruneConvTaps", "prune_conv_taps",
    "FusePatterns", "fuse_patterns",
    "InferType", "infer_type",
    "FoldConstant", "fold_constant", "BindParams", "bind_params", "DEFAULT_FOLD_LIMIT",
    "DeadCodeElimination", "EliminateCommonSubexpr", "MarkAlias", "RemoveIdentity", "Simplify",
    "SimplifyInference", "dead_code_elimination", "eliminate_common_subexpr", "mark_alias",
    "remove_identity", "simplify", "simplify_inference",
]
