"""The :class:`Target` object: a kind plus typed attributes, parsed from a string or dict."""

from __future__ import annotations

import functools
import shlex
from typing import TYPE_CHECKING, Any

from ..runtime.errors import TargetError
from .kind import TargetKind, get_target_kind, register_target_kind

if TYPE_CHECKING:
    from .isa import ISA

__all__ = ["Target", "host_cpu_name", "host_cpu_features"]


class Target:
    """A compilation target, e.g. ``Target("llvm -mcpu=znver4 -mattr=+avx2,+fma")``.

    Parameters
    ----------
    target : str, dict or Target
        ``"<kind> -opt=value -flag ..."`` or ``{"kind": ..., "opt": value, ...}``.
    host : str, dict or Target, optional
        The host target (for device kinds); kept for TVM familiarity.

    Attributes
    ----------
    kind : TargetKind
        Compares equal to its name (``target.kind == "llvm"``); ``target.kind.name``.
    attrs : dict
        Every option of the kind, parsed to its type, defaults filled in.
    keys : list of str
        Schedule dispatch keys.

    Notes
    -----
    ``str(target)`` is canonical (kind, then non-default options in declaration order), so
    equal targets print equally; equality and hashing use it.  For ``llvm``,
    ``-mcpu=native`` is resolved to the host CPU name and features at construction.
    """

    kind: TargetKind
    attrs: dict[str, Any]
    host: Target | None

    def __init__(self, target: "str | dict[str, Any] | Target", host: Any = None) -> None:
        if isinstance(target, Target):
            self.kind, self.attrs = target.kind, dict(target.attrs)
            self.host = target.host if host is None else Target(host)
            return
        if isinstance(target, str):
            kind_name, raw = _parse_string(target)
        elif isinstance(target, dict):
            raw = dict(target)
            kind_name = raw.pop("kind", None)
            if not isinstance(kind_name, str):
                raise TargetError(f"target dict needs a string 'kind', got {target!r}")
            if "host" in raw:
                host = raw.pop("host") if host is None else host
        else:
            raise TargetError(f"a target must be a str, dict or Target, got {type(target).__name__}")
        kind = get_target_kind(kind_name)
        attrs: dict[str, Any] = {}
        for k, v in raw.items():
            key = k.replace("-", "_")
            attrs[key] = kind.parse_value(key, v)
        for k in kind.options:
            if k not in attrs:
                attrs[k] = kind.default(k)
        if not attrs.get("keys"):
            attrs["keys"] = list(kind.default_keys)
        if kind.preprocess is not None:
            attrs = kind.preprocess(attrs)
        self.kind = kind
        self.attrs = attrs
        self.host = None if host is None else Target(host)

    # ------------------------------------------------------------------ accessors
    @property
    def keys(self) -> list[str]:
        """Schedule dispatch keys (``-keys`` or the kind's defaults)."""
        return list(self.attrs.get("keys") or [])

    @property
    def mcpu(self) -> str:
        """The ``-mcpu`` option ("" when the kind has none)."""
        return str(self.attrs.get("mcpu", "") or "")

    @property
    def mattr(self) -> list[str]:
        """The ``-mattr`` features ([] when the kind has none)."""
        return list(self.attrs.get("mattr", []) or [])

    @property
    def isa(self) -> "ISA":
        """The CPU instruction-set model, :func:`kiln.target.isa_of` (``TargetError`` for GPUs)."""
        from .isa import isa_of  # isa.py imports this module

        return isa_of(self)

    def get(self, key: str, default: Any = None) -> Any:
        """An attribute by name."""
        return self.attrs.get(key.replace("-", "_"), default)

    def export(self) -> dict[str, Any]:
        """The target as a JSON-friendly dict (``Target(t.export()) == t``)."""
        out: dict[str, Any] = {"kind": self.kind.name}
        out.update({k: (list(v) if isinstance(v, list) else v) for k, v in self.attrs.items()})
        return out

    # ------------------------------------------------------------------ text
    def __str__(self) -> str:
        parts = [self.kind.name]
        for k in self.kind.options:
            v: Any = self.attrs.get(k)  # typed by the option's declared type, checked below
            if k == "keys":
                if v == self.kind.default_keys:
                    continue
            elif v == self.kind.default(k):
                continue
            typ = self.kind.options[k][0]
            if typ is bool:
                parts.append(f"-{k}" if v else f"-{k}=0")
            elif typ is list:
                parts.append(f"-{k}={','.join(v)}")
            else:
                sv = str(v)
                parts.append(f"-{k}={shlex.quote(sv) if (' ' in sv or not sv) else sv}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Target(other)
            except TargetError:
                return False
        if not isinstance(other, Target):
            return NotImplemented
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @staticmethod
    def current() -> None:
        """Kiln has no implicit target context; pass targets explicitly."""
        return None


def _parse_string(s: str) -> tuple[str, dict[str, Any]]:
    try:
        toks = shlex.split(s)
    except ValueError as err:
        raise TargetError(f"cannot parse target string {s!r}: {err}") from None
    if not toks:
        raise TargetError("empty target string")
    kind, raw = toks[0], {}
    i = 1
    while i < len(toks):
        t = toks[i]
        if not t.startswith("-") or t in ("-", "--"):
            raise TargetError(f"target {s!r}: expected '-option=value', got {t!r}")
        t = t.lstrip("-")
        if "=" in t:
            k, v = t.split("=", 1)
        elif i + 1 < len(toks) and not toks[i + 1].startswith("-"):
            k, v = t, toks[i + 1]
            i += 1
        else:
            k, v = t, "true"  # a bare flag
        raw[k] = v
        i += 1
    return kind, raw


# ---------------------------------------------------------------------------- host CPU


@functools.lru_cache(maxsize=1)
def host_cpu_name() -> str:
    """LLVM's name of the host CPU (e.g. ``"znver3"``)."""
    import llvmlite.binding as llvm

    return str(llvm.get_host_cpu_name())


@functools.lru_cache(maxsize=1)
def host_cpu_features() -> list[str]:
    """The host CPU's features as LLVM ``+feat`` / ``-feat`` strings (sorted)."""
    import llvmlite.binding as llvm

    try:
        flat = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # some platforms cannot report features
        return []
    return sorted(f for f in flat.split(",") if f)


def _llvm_preprocess(attrs: dict[str, Any]) -> dict[str, Any]:
    # Resolve the host now so that str(target) (and thus the compile cache key) names the
    # real CPU: a cached object for "native" must never be reused on another machine.  The
    # full feature list (with "-" entries) matters in VMs that hide features the CPU model
    # would otherwise imply (e.g. AVX-512 on a znver4 guest).
    if attrs.get("mcpu") == "native":
        attrs["mcpu"] = host_cpu_name()
        if not attrs.get("mattr"):
            attrs["mattr"] = host_cpu_features()
    return attrs


def _register_builtin_kinds() -> None:
    cpu_opts = {
        "mcpu": (str, ""),
        "mattr": (list, []),
        "mtriple": (str, ""),
        "opt_level": (int, 3),
    }
    register_target_kind("llvm", {**cpu_opts, "fast_math": (bool, False)}, default_keys=("cpu",),
                         preprocess=_llvm_preprocess, override=True)
    register_target_kind("c", {**cpu_opts, "cc": (str, ""), "cflags": (list, [])}, default_keys=("cpu",),
                         override=True)
    # The GPU kinds are declared here, with the CPU ones, so that naming a target never imports a
    # code generator (target sits below codegen); their codegens and device runtimes are plug-ins
    # (kiln.runtime.plugins), imported on first build / first use.
    #
    # Every GPU kind also carries the knobs of the GPU schedules (kiln.topi.schedule.gpu), so a
    # new GPU kind brings its own values and a target string can change them for one build:
    #   tree_max_outputs -- reductions with at most this many outputs (and >= 32 terms each) are
    #                       work-group tree reductions; others get one work-item per output;
    #   shared_tiles     -- op tags (dense, matmul, conv2d_nchw) scheduled with local-memory
    #                       tiles instead of register tiles.
    # A GPU kind without them gets the schedules' fallback (1, none), the choices measured best
    # on PoCL.
    register_target_kind("cuda", {
        "arch": (str, "sm_80"),  # PTX for this architecture; the driver JITs it for newer GPUs
        "max_num_threads": (int, 1024),
        "thread_warp_size": (int, 32),
        "max_shared_memory_per_block": (int, 48 * 1024),
        "fast_math": (bool, False),
        "options": (list, []),
        "binary": (str, "ptx"),
        # One work-item per output leaves a discrete GPU idle below a few thousand outputs, so
        # trees go up to the schedules' MIN_WORK_ITEMS (256) - 1 outputs, and shared-memory
        # blocking is what GEMMs on such GPUs rely on. NOT measured (no GPU here): measure with
        # tests/cuda on a GPU and switch off what does not pay.
        "tree_max_outputs": (int, 255),
        "shared_tiles": (list, ["dense", "matmul", "conv2d_nchw"]),
    }, default_keys=("cuda", "gpu"), device_type=2, override=True)
    register_target_kind("opencl", {
        "max_num_threads": (int, 256),  # work-items per work-group the GPU schedules aim for
        # Measured on PoCL (OpenCL on the 2-core CPU; tables in docs/devices.md): trees tie or win
        # for a single output and lose for a few (PoCL runs a group's per-output loops as SIMD
        # lanes, and each barrier splits the group's work-item loop); local tiles are 2.8-4.6x
        # slower than register tiles for every dense / batch matmul / conv case
        # (`python bench/bench_opencl_local.py`), since PoCL backs local memory with ordinary
        # memory and serializes work-items between barriers.
        "tree_max_outputs": (int, 1),
        "shared_tiles": (list, []),
    }, default_keys=("opencl", "gpu"), device_type=4, override=True)


_register_builtin_kinds()
_ = TargetKind
