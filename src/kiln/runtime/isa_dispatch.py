"""One library, several CPU feature levels: the variant is chosen when the model is created.

A *portable* build (:func:`kiln.build_portable`, ``kiln build --isa-levels v2,v3,v4``) compiles a
model once per target (e.g. ``llvm -mcpu=x86-64-v4``, ``-v3``, ``-v2``). Each build is a complete
:class:`~kiln.runtime.ExecutorFactoryModule` — its own layouts, tiles, kernels (named after its
own ``mod_name``, so they never clash) and params — and an :class:`IsaDispatchModule` holds them,
best first, with the CPU features each needs. Exported, all of them go into one library whose
``.kiln_isa`` note is the *least* demanding variant's requirement (the library loads wherever one
variant can run); ``factory["default"](dev)`` then creates an executor of the first variant this
machine has every feature of. Code for the other variants is in the library but never called.

``KILN_ISA_VARIANT=<mod_name>`` forces a variant (to test each on one machine; a forced variant
the CPU cannot run is refused, not run). The C API does the same choice in C
(``docs/c_api.md``).

Binary payload (type key ``"IsaDispatch"``): UTF-8 JSON
``{"mod_name": str, "variants": [{"mod_name": str, "arch": str, "features": [str]}...]}``; the
module's imports are the variants' factories, in the same order.

Runtime layer: standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import cpu_features as _cpu
from .errors import FormatError, InputError, UnsupportedHostError
from .executor_factory import ExecutorFactoryModule
from .module import Module
from .registry import register_loader

__all__ = ["IsaDispatchModule", "Variant", "TYPE_KEY", "FORCE_ENV", "loadbinary_IsaDispatch"]

TYPE_KEY = "IsaDispatch"
#: Environment variable naming the variant to use (its ``mod_name``) instead of the best one.
FORCE_ENV = "KILN_ISA_VARIANT"


@dataclass(frozen=True)
class Variant:
    """One build: its ``mod_name``, architecture family and the CPU features its code needs."""

    mod_name: str
    arch: str
    features: tuple[str, ...]

    def missing(self, host_arch: str, host: frozenset[str] | None) -> list[str] | None:
        """Features this machine lacks (``[]``: runnable), or ``None`` for another architecture."""
        if self.arch != host_arch:
            return None
        if host is None:
            return []  # features cannot be told: as for a single-variant library
        return [f for f in self.features if f not in host]


class IsaDispatchModule(Module):
    """Builds of one model for several CPU feature levels, best first.

    Parameters
    ----------
    variants : sequence of (str, str, sequence of str)
        ``(mod_name, arch, features)`` of each build, best first.
    factories : sequence of Module, optional
        The builds' executor factories in the same order (``None`` when loading: the blob
        loader attaches them as imports).
    mod_name : str
        Name of the creation function (``module[mod_name](dev)``).
    """

    type_key = TYPE_KEY

    def __init__(self, variants: Sequence[Sequence[Any]], factories: Sequence[Module] | None = None,
                 mod_name: str = "default") -> None:
        super().__init__()
        if not variants:
            raise InputError("IsaDispatchModule needs at least one variant")
        self.variants = [Variant(str(v[0]), str(v[1]), tuple(sorted(v[2]))) for v in variants]
        names = [v.mod_name for v in self.variants]
        if len(set(names)) != len(names) or mod_name in names:
            raise InputError(f"IsaDispatchModule: variant names must be distinct and differ from {mod_name!r}; "
                             f"got {names}")
        if len({v.arch for v in self.variants}) != 1:
            raise InputError(f"IsaDispatchModule: variants for different architectures "
                             f"({sorted({v.arch for v in self.variants})}); one library holds one")
        self.mod_name = mod_name
        for f in factories or ():
            self.import_module(f)

    # ---- choosing ----------------------------------------------------------------------
    def select(self) -> int:
        """Index of the variant to run here: the forced one, else the first this CPU can run.

        Raises
        ------
        UnsupportedHostError
            No variant can run here, or the forced one cannot.
        InputError
            ``KILN_ISA_VARIANT`` names no variant.
        """
        host_arch, host = _cpu.host_cpu()
        forced = os.environ.get(FORCE_ENV)
        if forced:
            names = [v.mod_name for v in self.variants]
            if forced not in names:
                raise InputError(f"{FORCE_ENV}={forced!r} names no variant of this library; variants: {names}")
            i = names.index(forced)
            missing = self.variants[i].missing(host_arch, host)
            if missing:
                raise UnsupportedHostError(f"{FORCE_ENV}={forced!r}: this CPU lacks {', '.join(missing)}")
            if missing is None:
                raise UnsupportedHostError(f"{FORCE_ENV}={forced!r} is built for {self.variants[i].arch}, "
                                           f"this machine is {host_arch}")
            return i
        if host is None and all(v.arch == host_arch for v in self.variants):
            # features cannot be told (no /proc/cpuinfo): the least demanding variant is the safe one
            return min(range(len(self.variants)), key=lambda i: len(self.variants[i].features))
        why = []
        for i, v in enumerate(self.variants):
            missing = v.missing(host_arch, host)
            if missing == []:
                return i
            why.append(f"{v.mod_name}: " + (f"built for {v.arch}" if missing is None else
                                            f"needs {', '.join(missing or [])}"))
        raise UnsupportedHostError(f"no variant of this library runs on this {host_arch} CPU ({'; '.join(why)})")

    def selected_variant(self) -> str:
        """``mod_name`` of the variant :meth:`select` picks."""
        return self.variants[self.select()].mod_name

    def factory(self, index: int | None = None) -> ExecutorFactoryModule:
        """The executor factory of variant ``index`` (default: the selected one)."""
        i = self.select() if index is None else index
        imports = self.imported_modules
        if len(imports) != len(self.variants) or not all(isinstance(m, ExecutorFactoryModule) for m in imports):
            raise FormatError(f"IsaDispatch module {self.mod_name!r}: {len(self.variants)} variants need as many "
                              f"executor factories attached, got {[m.type_key for m in imports]}")
        f = imports[i]
        assert isinstance(f, ExecutorFactoryModule)  # checked above; for the type checker
        return f

    def library_isa_requirement(self) -> tuple[str, list[str]]:
        """What a library of all the variants needs to load: the least demanding variant's features."""
        least = min(self.variants, key=lambda v: len(v.features))
        return least.arch, list(least.features)

    def create(self, *devices: Any) -> Any:
        """An executor of the selected variant (what ``module[mod_name](*devices)`` does)."""
        return self.factory().create(*devices)

    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        if name == self.mod_name:
            return self.create
        table: dict[str, Callable[..., Any]] = {
            "selected_variant": self.selected_variant,
            "get_graph_json": lambda: self.factory().get_graph_json(),
            "get_graph_params": lambda: self.factory().get_graph_params(),
        }
        return table.get(name)

    # ---- serialization -------------------------------------------------------------------
    def save_to_binary(self) -> bytes:
        doc = {"mod_name": self.mod_name,
               "variants": [{"mod_name": v.mod_name, "arch": v.arch, "features": list(v.features)}
                            for v in self.variants]}
        return json.dumps(doc, sort_keys=True).encode("utf-8")

    def __repr__(self) -> str:
        return f"IsaDispatchModule(mod_name={self.mod_name!r}, variants={[v.mod_name for v in self.variants]})"


def loadbinary_IsaDispatch(payload: bytes) -> IsaDispatchModule:
    """Loader registered for type key ``"IsaDispatch"``; the factories are attached as imports afterwards.

    Raises
    ------
    FormatError
        On a payload that is not the JSON described in the module docstring.
    """
    where = "IsaDispatch payload"
    try:
        doc = json.loads(bytes(payload).decode("utf-8"))
        variants = [(v["mod_name"], v["arch"], v["features"]) for v in doc["variants"]]
        ok = (isinstance(doc["mod_name"], str) and all(isinstance(a, str) and isinstance(b, str) and isinstance(c, list)
                                                       and all(isinstance(x, str) for x in c) for a, b, c in variants))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise FormatError(f"{where}: not the JSON of an IsaDispatch module") from None
    if not ok:
        raise FormatError(f"{where}: variant names, architectures and features must be strings")
    try:
        return IsaDispatchModule(variants, None, doc["mod_name"])
    except InputError as err:
        raise FormatError(f"{where}: {err}") from None


register_loader(TYPE_KEY, loadbinary_IsaDispatch, override=True)
