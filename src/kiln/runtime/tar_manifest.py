"""``kiln_manifest.json`` of a ``.tar`` library: its fields and the compiler-option allow-list.

A ``.tar`` is compiled on the machine that loads it, with the options its manifest records.
Those options come from the file, so they are checked against an allow-list before ``cc``
sees them: options that make the compiler or linker write or read files of their choosing
(``-Wl,...``, ``-MF``, ``-o``, ``@file``, ``-B``, ``-specs``, ``-fplugin``, ``-I``/``-L`` paths,
...) are refused with a :class:`~kiln.runtime.errors.FormatError` naming the option.
The allow-list keeps *compilation* inside its private directory; it is not a sandbox: the
compiled library runs when it is loaded (``docs/security.md``).

Imports the standard library only (``kiln.runtime`` must run without a compiler stack).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from .errors import FormatError

__all__ = [
    "MANIFEST_NAME", "TAR_FORMAT", "TAR_VERSION", "SOURCE_EXTENSIONS", "check_compile_options",
    "is_allowed_option", "parse_manifest",
]

MANIFEST_NAME = "kiln_manifest.json"
TAR_FORMAT = "kiln-library-tar"
TAR_VERSION = 1

#: Extensions a manifest may name as compiler inputs (anything else could reach the linker
#: as a linker script).
SOURCE_EXTENSIONS = (".c", ".cc", ".cpp", ".cxx", ".s", ".S", ".o", ".a")

_MAX_OPTIONS = 256
_SAFE_VALUE = r"[A-Za-z0-9_.+-]+"
# -f flags that only change code generation (never name a file, plugin or dump).
_F_FLAGS = frozenset({
    "PIC", "pic", "PIE", "pie", "openmp", "fast-math", "no-fast-math", "math-errno", "no-math-errno",
    "trapping-math", "no-trapping-math", "finite-math-only", "no-finite-math-only", "associative-math",
    "no-associative-math", "reciprocal-math", "no-reciprocal-math", "signed-zeros", "no-signed-zeros",
    "strict-aliasing", "no-strict-aliasing", "wrapv", "no-wrapv", "omit-frame-pointer",
    "no-omit-frame-pointer", "unroll-loops", "no-unroll-loops", "tree-vectorize", "no-tree-vectorize",
    "vectorize", "no-vectorize", "slp-vectorize", "no-slp-vectorize", "plt", "no-plt", "common",
    "no-common", "stack-protector", "stack-protector-strong", "no-stack-protector", "exceptions",
    "no-exceptions", "asynchronous-unwind-tables", "no-asynchronous-unwind-tables", "builtin",
    "no-builtin", "inline-functions", "no-inline", "fp-contract=fast", "fp-contract=on",
    "fp-contract=off", "visibility=default", "visibility=hidden", "diagnostics-color=never",
    "no-diagnostics-color", "prefetch-loop-arrays", "no-semantic-interposition",
})
_PATTERNS = tuple(re.compile(p) for p in (
    r"-O[0-3sgz]?|-Ofast",
    r"-g[0-3]?|-w|-pthread|-shared|-pipe",
    r"-std=(c|gnu)(89|90|99|11|17|18|2x|23)",
    r"-l(m|pthread|dl|rt|gomp|omp)",
    # -m<feature>, -mno-<feature>, -march= / -mcpu= / -mtune= / -mfpu= ... with a plain value
    rf"-m[a-z0-9][a-z0-9-]*(={_SAFE_VALUE})?",
    # warnings (comma-free, so never -Wl, / -Wa, / -Wp,)
    r"-W(no-)?[a-z][a-z0-9-]+",
    # macros with C identifier names and a plain value
    rf"-[DU][A-Za-z_][A-Za-z0-9_]*(={_SAFE_VALUE})?",
))


def is_allowed_option(option: str) -> bool:
    """Whether ``option`` may come from a ``.tar`` manifest (see the module docstring)."""
    if not isinstance(option, str):
        return False
    if option.startswith("-f"):
        return option[2:] in _F_FLAGS
    return any(p.fullmatch(option) for p in _PATTERNS)


def check_compile_options(options: Sequence[Any], where: str) -> list[str]:
    """Return ``options`` as a list, or raise FormatError naming the first refused option.

    Raises
    ------
    FormatError
        If ``options`` is not a list of strings or one is outside the allow-list.
    """
    if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
        raise FormatError(f"{where}: 'options' must be a list of strings")
    if len(options) > _MAX_OPTIONS:
        raise FormatError(f"{where}: {len(options)} compiler options (at most {_MAX_OPTIONS})")
    for o in options:
        if not is_allowed_option(o):
            raise FormatError(
                f"{where}: compiler option {o!r} is not allowed in a .tar library (options that name "
                "files, paths, plugins, linker or preprocessor pass-throughs are refused; "
                "see docs/security.md)"
            )
    return list(options)


def _file_name(where: str, what: str, name: Any) -> str:
    if (not isinstance(name, str) or not name or "/" in name or "\\" in name or "\0" in name
            or name in (".", "..") or name.startswith("-")):
        raise FormatError(f"{where}: invalid file name {name!r} for {what}")
    return name


def _compiler_input(where: str, what: str, name: Any) -> str:
    name = _file_name(where, what, name)
    if not name.endswith(SOURCE_EXTENSIONS):
        raise FormatError(f"{where}: {what} {name!r} must end in one of {', '.join(SOURCE_EXTENSIONS)}")
    return name


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Decode and validate a manifest; returns a dict with every documented field normalized.

    The result has ``modules`` (list of dicts with a checked ``file``), ``crt``, ``blob``
    (str or None), ``addons`` (list of str) and ``options`` (allow-listed).

    Raises
    ------
    FormatError
        If it is not UTF-8 JSON, not this format/version, or any field is malformed.
    """
    try:
        man = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise FormatError(f"{where}: not valid JSON ({type(err).__name__}: {err})") from None
    if not isinstance(man, dict) or man.get("format") != TAR_FORMAT:
        raise FormatError(f"{where}: format is not {TAR_FORMAT!r}")
    if man.get("version") != TAR_VERSION:
        raise FormatError(f"{where}: unsupported version {man.get('version')!r} (this Kiln reads {TAR_VERSION})")
    mods = man.get("modules", [])
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise FormatError(f"{where}: 'modules' must be a list of objects")
    for m in mods:
        _compiler_input(where, "module file", m.get("file"))
        funcs = m.get("functions")
        if funcs is not None and (not isinstance(funcs, list) or not all(isinstance(f, str) for f in funcs)):
            raise FormatError(f"{where}: 'functions' of {m.get('file')!r} must be a list of strings")
    addons = man.get("addons", [])
    if not isinstance(addons, list):
        raise FormatError(f"{where}: 'addons' must be a list")
    blob = man.get("blob")
    return {
        **man,
        "modules": mods,
        "crt": _compiler_input(where, "crt", man.get("crt")),
        "blob": None if blob is None else _file_name(where, "blob", blob),
        "addons": [_compiler_input(where, "addon", a) for a in addons],
        "options": check_compile_options(man.get("options", []), where),
    }
