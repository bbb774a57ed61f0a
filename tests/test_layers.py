"""Every import in ``src/kiln`` points down the layer table of ``docs/architecture.md``.

The modules are parsed, not imported, so the test sees what an import header hides: imports
inside functions, relative imports, ``importlib.import_module("kiln....")`` calls and any
other string literal that names a Kiln module (lazy plug-in tables). A module may import its
own layer and the layers below it; anything else is listed as
``a.b imports c.d (layer X may not import layer Y)``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: The layer table, bottom first: the same order and reasons as docs/architecture.md. A module
#: belongs to the layer of the longest prefix below that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("kiln.runtime", "kiln.nd", "kiln._version")),
    ("contrib", ("kiln.contrib",)),
    ("target", ("kiln.target",)),
    ("ir", ("kiln.ir",)),
    ("frontend", ("kiln.frontend",)),
    ("tir", ("kiln.tir",)),
    ("te", ("kiln.te",)),
    ("topi", ("kiln.topi",)),
    ("passes", ("kiln.transform",)),
    ("codegen", ("kiln.codegen",)),
    ("driver", ("kiln.driver",)),
    ("tools", ("kiln", "kiln.autotune", "kiln.cli", "kiln.frontend.onnx_backend")),
]

RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
PREFIXES = {p: name for name, prefixes in LAYERS for p in prefixes}


def layer_of(module: str) -> str:
    """The layer of ``module`` (longest table prefix); KeyError if the table misses it.

    ``kiln`` names the package facade alone, not a prefix: a new package must get a row.
    """
    if module == "kiln":
        return PREFIXES[module]
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        name = PREFIXES.get(".".join(parts[:n]))
        if name is not None:
            return name
    raise KeyError(module)


def all_modules(src: Path = SRC) -> dict[str, Path]:
    """Dotted name -> file for every module of the ``kiln`` package under ``src``."""
    out = {}
    for path in sorted((src / "kiln").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str:
    """The longest known module ``name`` starts with (``kiln.a.b.attr`` -> ``kiln.a.b``)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in known:
            return cand
    return name


def imports_of(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every Kiln module that ``module`` imports, anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def absolute(name: str, level: int) -> str:
        if not level:
            return name
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            mod = absolute(node.module or "", node.level)
            for alias in node.names:
                # "from kiln import te" imports the module kiln.te; "from kiln import x" the package.
                sub = f"{mod}.{alias.name}"
                yield sub if sub in known else mod
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            name = _literal_prefix(node.args[0])
            if name is not None:
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    name = absolute(name[level:], level)
                yield name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A module named in a string (a lazy import table) is an import all the same.
            if node.value.startswith("kiln.") and node.value in known:
                yield node.value


def _literal_prefix(arg: ast.expr) -> str | None:
    """The module a name argument spells: a literal, or the literal package before an f-string's
    first placeholder (``f"kiln.codegen.{kind}"`` imports somewhere in ``kiln.codegen``)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and "." in head.value:
            return head.value.rpartition(".")[0] or "."
    return None


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))


def upward_imports(src: Path = SRC) -> list[str]:
    """``"a imports b (layer X may not import layer Y)"`` for every import that points up."""
    known = all_modules(src)
    found = []
    for module, path in known.items():
        here = layer_of(module)
        for target in sorted(set(imports_of(module, path, known))):
            if target != "kiln" and not target.startswith("kiln."):
                continue
            target = _resolve(target, known)
            there = layer_of(target)
            if RANK[there] > RANK[here]:
                found.append(f"{module} imports {target} (layer {here} may not import layer {there})")
    return found


def test_every_module_has_a_layer() -> None:
    with pytest.raises(KeyError):
        layer_of("kiln.some_new_package.module")  # a package the table does not name
    missing = []
    for module in all_modules():
        try:
            layer_of(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"modules missing from the layer table: {missing}"


def test_no_upward_imports() -> None:
    found = upward_imports()
    assert not found, "imports against the layer table (docs/architecture.md):\n" + "\n".join(found)


def test_the_table_matches_the_docs() -> None:
    doc = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for prefix in PREFIXES:
        assert f"`{prefix}`" in doc, f"{prefix} is in the test's layer table but not in docs/architecture.md"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f():\n    from ..driver import build\n", "kiln.driver.build"),
        ("import importlib\nimportlib.import_module('kiln.codegen.cuda')\n", "kiln.codegen.cuda"),
        ("PLUGINS = {'cuda': 'kiln.codegen.cuda'}\n", "kiln.codegen.cuda"),
        ("from .. import te\n", "kiln.te"),
        ("from .. import __version__\n", "kiln"),
        ("import importlib\nimportlib.import_module(f'kiln.driver.{1}')\n", "kiln.driver"),
    ],
)
def test_the_scanner_sees_hidden_imports(tmp_path: Path, source: str, expected: str) -> None:
    """Each way of hiding an arrow is found (so the main test can fail)."""
    pkg = tmp_path / "kiln"
    for sub in ("", "runtime", "te", "driver", "codegen"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "driver" / "build.py").write_text("")
    (pkg / "codegen" / "cuda.py").write_text("")
    (pkg / "runtime" / "probe.py").write_text(source)
    found = upward_imports(tmp_path)
    assert any(f"kiln.runtime.probe imports {expected} " in line for line in found), found
