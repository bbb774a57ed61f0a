"""``kiln.build_portable``: one library with a build per CPU feature level, chosen at load.

A library built for ``-mcpu=native`` refuses to load on an older CPU; one built for the x86-64
baseline is slow on a new one. :func:`build_portable` compiles the model once per target (by
default the x86-64 micro-architecture levels v4, v3 and v2), each with its own schedules,
layouts and kernel names (``mod_name`` + level), and wraps the builds in a
:class:`~kiln.runtime.isa_dispatch.IsaDispatchModule`: exported, they make one library that loads
on any x86-64-v2 machine and runs the best variant the CPU supports (``docs/isa.md``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from ..ir import Graph
from ..runtime.cpu_features import CHECKED
from ..runtime.errors import InputError
from ..runtime.isa_dispatch import IsaDispatchModule
from ..target import Target
from ..target.isa import isa_of
from .build import build

__all__ = ["build_portable", "X86_LEVELS", "level_targets"]

#: The x86-64 micro-architecture levels (psABI): v2 SSE4.2/POPCNT, v3 AVX2/FMA/BMI, v4 AVX-512.
X86_LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64-v2")


def level_targets(levels: Sequence[str], base: str = "llvm") -> list[str]:
    """Targets for CPU levels given as ``v4`` / ``x86-64-v3`` / any ``-mcpu`` name, on ``base``.

    >>> level_targets(["v3", "v2"])
    ['llvm -mcpu=x86-64-v3', 'llvm -mcpu=x86-64-v2']
    """
    out = []
    for lv in levels:
        lv = lv.strip()
        if not lv:
            continue
        cpu = f"x86-64-{lv}" if re.fullmatch(r"v[1-4]", lv) else lv
        out.append(f"{base} -mcpu={cpu}")
    return out


def _variant_name(mod_name: str, target: Target) -> str:
    return f"{mod_name}_" + re.sub(r"[^A-Za-z0-9]", "_", target.mcpu or "generic")


def build_portable(mod: Graph, params: Mapping[str, Any] | None = None,
                   targets: Sequence[Any] | None = None, mod_name: str = "default",
                   **build_kwargs: Any) -> IsaDispatchModule:
    """Compile ``mod`` for several CPU feature levels into one dispatching module.

    Parameters
    ----------
    mod : Graph
        The model.
    params : dict of str to array, optional
        Weights (bound in every variant).
    targets : sequence of str or Target, optional
        One CPU target per variant (default: ``llvm -mcpu=x86-64-v4``, ``-v3``, ``-v2``). They
        must be for one architecture; the order does not matter (variants are ordered by how
        many CPU features they need, most first).
    mod_name : str
        The creation function's name (``lib[mod_name](dev)``); variant ``i`` is built as
        ``<mod_name>_<cpu>``.
    **build_kwargs
        Passed to every :func:`kiln.build` (``opt_level``, ``link_params``, ``tuning_log``...).

    Returns
    -------
    IsaDispatchModule
        Export it like a factory (``.export_library("model.so")``).

    Raises
    ------
    InputError
        No targets, a non-CPU target, or two targets giving the same variant name.
    """
    tgts = [t if isinstance(t, Target) else Target(t) for t in (targets or level_targets(X86_LEVELS))]
    if not tgts:
        raise InputError("build_portable needs at least one target")
    built = []
    for t in tgts:
        if t.kind.name not in ("llvm", "c"):
            raise InputError(f"build_portable: target {str(t)!r} is not a CPU target (llvm or c)")
        isa = isa_of(t)
        # what the loader can check (as in the library's .kiln_isa note): vector / bit-manipulation sets
        feats = sorted(set(isa.features) & CHECKED.get(isa.arch, frozenset()))
        built.append((len(feats), _variant_name(mod_name, t), t, isa.arch, feats))
    names = [b[1] for b in built]
    if len(set(names)) != len(names):
        raise InputError(f"build_portable: targets give duplicate variant names {names}; use distinct -mcpu values")
    built.sort(key=lambda b: -b[0])  # most features first: the first runnable one is the best
    variants, factories = [], []
    for _, name, t, arch, feats in built:
        factories.append(build(mod, target=t, params=params, mod_name=name, **build_kwargs))
        variants.append((name, arch, feats))
    return IsaDispatchModule(variants, factories, mod_name)
