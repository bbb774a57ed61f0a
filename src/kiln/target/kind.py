"""Target kinds: the registry of code-generation targets and their typed options.

Imports only the runtime: a kind never names a code generator (codegens register themselves
with :func:`kiln.codegen.register_codegen`; the layer test in tests/test_layers.py checks it).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence

from ..runtime.errors import TargetError

__all__ = ["TargetKind", "register_target_kind", "get_target_kind", "list_target_kinds", "COMMON_OPTIONS"]

OptionSpec = tuple[type, Any]

#: Options every kind accepts.
COMMON_OPTIONS: dict[str, OptionSpec] = {
    "keys": (list, None),   # dispatch keys for schedules ("cpu", "gpu", ...); default: the kind's
    "tag": (str, ""),
    "device": (str, ""),
    "model": (str, ""),
    "libs": (list, []),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class TargetKind:
    """A registered target kind.

    Attributes
    ----------
    name : str
        The kind (first word of a target string, e.g. ``"llvm"``).
    options : dict
        Option name → ``(type, default)`` with type one of ``bool``, ``int``, ``str``, ``list``.
    default_keys : list of str
        Keys used when a target does not give ``-keys``.
    preprocess : callable, optional
        ``f(attrs: dict) -> dict`` run after parsing (e.g. resolving ``-mcpu=native``).
    device_type : int
        DLPack device type the kind's code runs on (1 = CPU).
    """

    def __init__(self, name: str, options: dict[str, OptionSpec], default_keys: Sequence[str],
                 preprocess: Callable[[dict[str, Any]], dict[str, Any]] | None = None, device_type: int = 1) -> None:
        self.name = name
        self.options = {**COMMON_OPTIONS, **options}
        self.default_keys = list(default_keys)
        self.preprocess = preprocess
        self.device_type = device_type

    def parse_value(self, key: str, value: Any) -> Any:
        """Convert an option value (string or Python value) to the option's declared type."""
        if key not in self.options:
            raise TargetError(
                f"target kind {self.name!r} has no option {key!r}; valid options: {', '.join(sorted(self.options))}"
            )
        typ = self.options[key][0]
        try:
            if typ is bool:
                if isinstance(value, bool):
                    return value
                if isinstance(value, int):
                    return bool(value)
                s = str(value).strip().lower()
                if s in _TRUE:
                    return True
                if s in _FALSE:
                    return False
                raise ValueError(value)
            if typ is int:
                if isinstance(value, bool):
                    raise ValueError(value)
                return int(value)
            if typ is list:
                if isinstance(value, str):
                    return [v for v in (x.strip() for x in value.split(",")) if v]
                if isinstance(value, Iterable):
                    return [str(v) for v in value]
                raise ValueError(value)
            if isinstance(value, (list, tuple, dict)):
                raise ValueError(value)
            return str(value)
        except (TypeError, ValueError):
            raise TargetError(
                f"target {self.name}: option {key!r} expects {typ.__name__}, got {value!r}"
            ) from None

    def default(self, key: str) -> Any:
        """Default value of an option (a fresh copy for lists)."""
        d = self.options[key][1]
        return list(d) if isinstance(d, list) else d

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"TargetKind({self.name!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TargetKind):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)


_KINDS: dict[str, TargetKind] = {}
_LOCK = threading.Lock()


def register_target_kind(name: str, options: dict[str, OptionSpec] | None = None,
                         default_keys: Sequence[str] = ("cpu",),
                         preprocess: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                         device_type: int = 1, override: bool = False) -> TargetKind:
    """Register a target kind (plug-ins call this; no core file changes needed).

    Parameters
    ----------
    name : str
        Kind name, e.g. ``"mycpu"``.
    options : dict, optional
        ``{option: (type, default)}`` with type ``bool``, ``int``, ``str`` or ``list``
        (lists are written comma-separated in target strings).
    default_keys : list of str
        Schedule dispatch keys when the target gives no ``-keys``.
    preprocess : callable, optional
        ``f(attrs) -> attrs`` run on every parsed target of this kind.
    device_type : int
        DLPack device type (1 = CPU).
    override : bool
        Replace an existing kind of the same name.

    Returns
    -------
    TargetKind

    Raises
    ------
    TargetError
        If the kind exists and ``override`` is false, or an option spec is malformed.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise TargetError(f"register_target_kind: invalid kind name {name!r}")
    opts = dict(options or {})
    for k, spec in opts.items():
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in (bool, int, str, list)):
            raise TargetError(f"register_target_kind({name!r}): option {k!r} must be (bool|int|str|list, default)")
    with _LOCK:
        if name in _KINDS and not override:
            raise TargetError(f"target kind {name!r} is already registered (pass override=True)")
        kind = TargetKind(name, opts, default_keys, preprocess, device_type)
        _KINDS[name] = kind
    return kind


def get_target_kind(name: str) -> TargetKind:
    """The registered kind ``name``.

    Raises
    ------
    TargetError
        Listing the registered kinds.
    """
    k = _KINDS.get(name)
    if k is None:
        raise TargetError(f"unknown target kind {name!r}; registered kinds: {', '.join(list_target_kinds())}")
    return k


def list_target_kinds() -> list[str]:
    """Names of all registered target kinds."""
    return sorted(_KINDS)
