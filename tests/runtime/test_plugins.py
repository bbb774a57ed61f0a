"""Back ends are plug-ins: found through their descriptors, imported on first use, never named by core.

A fake third-party package (a temporary ``*.dist-info`` with a ``kiln.plugins`` entry point on
``sys.path``) brings a device type, a module-loader type key and a codegen kind, and every core
registry finds it without an edit; broken plug-ins fail with a Kiln error naming them; ``import
kiln`` imports no plug-in; and the core tables name no back end (checked on their source).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import kiln
from kiln import codegen
from kiln.runtime import plugins, registry
from kiln.runtime.errors import CompileError, DeviceError, KilnError, LoaderNotFoundError
from kiln.target import Target, register_target_kind
from kiln.topi.schedule import gpu

SRC = Path(__file__).resolve().parents[2] / "src"
# the module, not the kiln.runtime.device() function that kiln.runtime's lazy names return
rt_device = importlib.import_module("kiln.runtime.device")

FAKE_TYPE = 97  # device type codes no real back end uses
BROKEN_TYPE = 98
SILENT_TYPE = 99

DEVICE_MODULE = """
from kiln.runtime.device import CPUDeviceAPI, register_device_api
from kiln.runtime.registry import register_loader, register_payload_describer


class FakeAPI(CPUDeviceAPI):  # host memory under another device type: enough to allocate and copy
    pass


register_device_api({code}, FakeAPI(), name="{name}", override=True)
register_loader("{key}", lambda payload: ("{key}", bytes(payload)), override=True)
register_payload_describer("{key}", lambda payload: {{"bytes": len(payload)}}, override=True)
"""

CODEGEN_MODULE = """
from kiln.codegen import register_codegen

register_codegen("{kind}", lambda funcs, target: ("built by {kind}", len(funcs), str(target)), override=True)
"""


def _write_package(root: Path, pkg: str, entry_points: dict[str, str], files: dict[str, str]) -> None:
    """A package ``pkg`` under ``root`` with ``files`` and a dist-info declaring ``entry_points``."""
    (root / pkg).mkdir()
    for name, text in files.items():
        (root / pkg / name).write_text(textwrap.dedent(text))
    dist = root / f"{pkg}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on ``sys.path`` for fake distributions; every registration undone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._reset_for_tests()
    yield tmp_path
    plugins._reset_for_tests()
    for code in (FAKE_TYPE, BROKEN_TYPE, SILENT_TYPE):
        rt_device._REGISTRY.pop(code, None)
        rt_device._TYPE_NAMES.pop(code, None)
    for name in [n for n, t in rt_device._NAME_TYPES.items() if t in (FAKE_TYPE, BROKEN_TYPE, SILENT_TYPE)]:
        del rt_device._NAME_TYPES[name]
    for fn in registry.list_global_func_names():
        if "fake" in fn:
            registry.remove_global_func(fn)
    for mod in [m for m in sys.modules if m.startswith("kilnfake_")]:
        del sys.modules[mod]


def _fake_plugin(site: Path) -> None:
    _write_package(site, "kilnfake_good", {"fakeplug": "kilnfake_good:PLUGIN"}, {
        "__init__.py": f"""
            # The descriptor: plain data, imported by discovery; the parts below are imported on use.
            PLUGIN = {{
                "name": "fakeplug",
                "devices": [{{"type_code": {FAKE_TYPE}, "name": "fakedev", "aliases": ("fd",)}}],
                "loaders": ("fakemod",),
                "codegens": ("fakekind",),
                "device_module": ".device",
                "codegen_module": ".codegen",
                "package": "kilnfake_good",
            }}
            """,
        "device.py": DEVICE_MODULE.format(code=FAKE_TYPE, name="fakedev", key="fakemod"),
        "codegen.py": CODEGEN_MODULE.format(kind="fakekind"),
    })


def test_a_third_party_plugin_is_found_by_every_registry(site: Path) -> None:
    _fake_plugin(site)
    dev = kiln.device("fakedev:1")
    assert (dev.device_type, dev.device_id, str(dev)) == (FAKE_TYPE, 1, "fakedev(1)")
    assert kiln.device("FD") == rt_device.Device(FAKE_TYPE, 0)
    assert "kilnfake_good.device" not in sys.modules  # a name needs only the descriptor
    assert dev.exist  # first use imports the device module
    assert "kilnfake_good.device" in sys.modules and "kilnfake_good.codegen" not in sys.modules
    arr = kiln.nd.array([1.0, 2.0], device=dev)
    assert arr.device == dev and arr.numpy().tolist() == [1.0, 2.0]

    assert registry.get_loader("fakemod")(b"xy") == ("fakemod", b"xy")
    assert registry.get_payload_describer("fakemod")(b"xyz") == {"bytes": 3}
    assert "fakemod" in registry.list_loaders()

    assert "fakekind" in codegen.list_codegens() and "kilnfake_good.codegen" not in sys.modules
    register_target_kind("fakekind", {}, default_keys=("fakekind",), device_type=FAKE_TYPE, override=True)
    out = codegen.get_codegen("fakekind")([], Target("fakekind"))
    assert out == ("built by fakekind", 0, "fakekind")
    assert [p.name for p in plugins.list_plugins()] == ["cuda", "opencl", "fakeplug"]
    assert plugins.get_plugin("fakeplug").origin == "entry point fakeplug = kilnfake_good:PLUGIN"


def test_broken_plugins_are_named_in_kiln_errors(site: Path) -> None:
    _write_package(site, "kilnfake_broken", {
        "brokenimport": "kilnfake_broken.missing_module:PLUGIN",  # the entry point itself fails
        "brokenparts": "kilnfake_broken:PARTS",                   # its modules fail on import
        "silent": "kilnfake_broken:silent",                       # a callable; registers nothing
        "badcode": "kilnfake_broken:BADCODE",                     # malformed descriptor
        "thief": "kilnfake_broken:THIEF",                         # claims the CUDA device type
    }, {
        "__init__.py": f"""
            from kiln.runtime.plugins import Plugin, PluginDevice

            PARTS = Plugin("brokenparts", devices=(PluginDevice({BROKEN_TYPE}, "brokendev"),),
                           loaders=("brokenmod",), codegens=("brokenkind",),
                           device_module="kilnfake_broken.bad_device", codegen_module="kilnfake_broken.bad_codegen")


            def silent():
                return Plugin("silent", devices=(PluginDevice({SILENT_TYPE}, "silentdev"),),
                              device_module="kilnfake_broken.empty")


            BADCODE = {{"name": "badcode", "devices": [{{"type_code": -3, "name": "neg"}}], "device_module": "x"}}
            THIEF = Plugin("thief", devices=(PluginDevice(2, "stolen"),), device_module="x")
            """,
        "bad_device.py": "raise RuntimeError('driver bindings exploded')\n",
        "bad_codegen.py": "import kilnfake_no_such_dependency\n",
        "empty.py": "",
    })
    with pytest.raises(DeviceError) as err:
        kiln.device("nosuchdev")
    msg = str(err.value)
    assert "brokendev" in msg and "silentdev" in msg  # the good descriptors were still registered
    errors = plugins.discovery_errors()
    assert set(errors) == {"brokenimport", "badcode", "thief"}
    assert "'brokenimport'" in errors["brokenimport"] and "ModuleNotFoundError" in errors["brokenimport"]
    assert "type code must be a positive int" in errors["badcode"]
    assert "claims ['2']" in errors["thief"] and "'cuda'" in errors["thief"]

    dev = kiln.device("brokendev")
    assert dev.exist is False  # exist answers, it does not raise
    with pytest.raises(DeviceError, match=r"plug-in 'brokenparts' .*bad_device.*RuntimeError: driver bindings explo"):
        rt_device.get_device_api(dev)
    with pytest.raises(LoaderNotFoundError, match=r"plug-in 'brokenparts'.*RuntimeError"):
        registry.get_loader("brokenmod")
    assert registry.get_payload_describer("brokenmod") is None
    with pytest.raises(CompileError, match=r"plug-in 'brokenparts'.*kilnfake_no_such_dependency") as cerr:
        codegen.get_codegen("brokenkind")
    assert isinstance(cerr.value.__cause__, plugins.PluginError)
    with pytest.raises(DeviceError, match=r"plug-in 'silent'.*was imported but did not register device type 99"):
        rt_device.get_device_api(SILENT_TYPE)
    with pytest.raises(LoaderNotFoundError, match="plug-ins that failed to load: plug-in 'brokenimport'"):
        registry.get_loader("nobody_loads_this")
    with pytest.raises(CompileError, match="plug-ins that failed to load"):
        codegen.get_codegen("nobody_builds_this")
    for e in (err.value, cerr.value):
        assert isinstance(e, KilnError) and not isinstance(e, ImportError)


def test_register_plugin_validates_and_rejects_clashes(site: Path) -> None:
    with pytest.raises(plugins.PluginError, match="no device_module"):
        plugins.register_plugin({"name": "nomod", "devices": [{"type_code": 90, "name": "nomod"}]})
    with pytest.raises(plugins.PluginError, match="already registered"):
        plugins.register_plugin(plugins.Plugin("cuda"))
    with pytest.raises(plugins.PluginError, match=r"claims \['opencl'\].*plug-in 'opencl'"):
        plugins.register_plugin(plugins.Plugin("mycl", codegens=("opencl",), codegen_module="x"))
    with pytest.raises(plugins.PluginError, match="relative module names need package"):
        plugins.register_plugin(plugins.Plugin("rel", loaders=("rel",), loader_module=".x"))
    p = plugins.register_plugin(plugins.Plugin("byhand", loaders=("byhand_key",), loader_module="kilnfake_x"))
    assert plugins.find_loader("byhand_key") is p and p.module_for("loader") == "kilnfake_x"


def test_builtin_lookups_never_read_entry_points(site: Path) -> None:
    # cuda / opencl and the CPU are answered from the built-in list: no distribution scan.
    kiln.device("cl"), kiln.device("gpu"), str(kiln.runtime.cuda(3)), kiln.opencl().exist
    registry.get_loader("opencl"), plugins.find_codegen("cuda")
    assert not plugins._DISCOVERED


def test_builtin_descriptors_name_real_modules() -> None:
    for p in plugins.BUILTIN_PLUGINS:
        for facet in ("device", "loader", "codegen"):
            mod = p.module_for(facet)
            assert mod is not None and importlib.util.find_spec(mod) is not None, (p.name, facet, mod)


def test_import_kiln_imports_no_plugin() -> None:
    """``import kiln`` and naming built-in devices import no plug-in module and read no entry point;
    ``list_codegens`` names cuda / opencl without importing their codegens."""
    modules = sorted({p.module_for(f) for p in plugins.BUILTIN_PLUGINS for f in ("device", "loader", "codegen")})
    script = textwrap.dedent(f"""
        import sys
        import kiln
        from kiln.runtime import plugins
        modules = {modules!r}
        assert not [m for m in modules if m in sys.modules], [m for m in modules if m in sys.modules]
        d = kiln.device("opencl"); s = str(kiln.runtime.cuda(1)); kiln.device("nvptx")
        assert (d.device_type, s) == (4, "cuda(1)")
        assert not [m for m in modules if m in sys.modules], [m for m in modules if m in sys.modules]
        assert not plugins._DISCOVERED and "importlib.metadata" not in sys.modules
        from kiln import codegen
        kinds = codegen.list_codegens()
        assert "cuda" in kinds and "opencl" in kinds, kinds
        assert "kiln.codegen.cuda" not in sys.modules and "kiln.codegen.opencl" not in sys.modules
        print("NO PLUGIN IMPORTED")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "NO PLUGIN IMPORTED" in proc.stdout, proc.stdout + proc.stderr


# The core tables: none may name a back end (kind, type key or module) -- only plugins.py does.
CORE_FILES = ["kiln/runtime/registry.py", "kiln/runtime/device.py", "kiln/codegen/registry.py",
              "kiln/topi/schedule/gpu.py"]
BACKEND_WORDS = ("cuda", "opencl", "nvptx", "cl")
BACKEND_MODULES = tuple(f"{b}_{part}" for b in ("cuda", "opencl") for part in ("driver", "device", "api"))


def _backend_strings(source: str) -> list[tuple[int, str]]:
    """String literals of ``source`` naming a back end, docstrings aside (comments are not in the AST)."""
    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
        # __all__ lists the public constructors kiln.runtime.cuda() / opencl(): names, not tables
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            docs.update(id(c) for c in ast.walk(node.value))
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            words = n.value.lower().replace(".", " ").replace(":", " ").split()
            if any(w in BACKEND_WORDS or w.startswith(BACKEND_MODULES) for w in words):
                found.append((n.lineno, n.value))
    return found


@pytest.mark.parametrize("rel", CORE_FILES)
def test_core_tables_name_no_backend(rel: str) -> None:
    found = [f"{rel}:{line}: {text!r}" for line, text in _backend_strings((SRC / rel).read_text(encoding="utf-8"))]
    assert not found, "back ends named outside kiln/runtime/plugins.py:\n" + "\n".join(found)


def test_the_core_table_check_catches_a_table() -> None:
    """The check above fails on tables like the ones this design removed, and skips docstrings."""
    probe = '"""doc: cuda"""\nT = {2: "kiln.runtime.cuda_driver"}\nK = ["opencl", "gpu"]\nM = "kiln.codegen.cuda"\n'
    assert sorted(text for _, text in _backend_strings(probe)) == ["kiln.codegen.cuda", "kiln.runtime.cuda_driver",
                                                                  "opencl"]


# GPU schedule knobs are target-kind options: a new GPU kind brings its own values.


def test_gpu_schedule_knobs_come_from_the_target() -> None:
    assert gpu.tree_max_outputs(Target("opencl")) == 1 and gpu.shared_tiles(Target("opencl")) == frozenset()
    assert gpu.tree_max_outputs(Target("cuda")) == 255
    assert gpu.shared_tiles(Target("cuda")) == {"dense", "matmul", "conv2d_nchw"}
    t = Target("opencl -shared_tiles=dense,matmul -tree_max_outputs=16")
    assert gpu.shared_tiles(t) == {"dense", "matmul"} and gpu.tree_max_outputs(t) == 16
    assert str(t) == "opencl -tree_max_outputs=16 -shared_tiles=dense,matmul"  # so the cache sees it
    assert str(Target("opencl")) == "opencl"
    register_target_kind("fakegpu", {"tree_max_outputs": (int, 40), "shared_tiles": (list, ["matmul"])},
                         default_keys=("fakegpu", "gpu"), device_type=FAKE_TYPE, override=True)
    assert gpu.tree_max_outputs(Target("fakegpu")) == 40 and gpu.shared_tiles(Target("fakegpu")) == {"matmul"}
    register_target_kind("plaingpu", {}, default_keys=("plaingpu", "gpu"), device_type=FAKE_TYPE, override=True)
    assert gpu.tree_max_outputs(Target("plaingpu")) == gpu.FALLBACK_TREE_MAX_OUTPUTS
    assert gpu.shared_tiles(Target("plaingpu")) == frozenset() and gpu.tree_max_outputs(None) == 1
    from kiln.topi.registry import get_schedule

    assert get_schedule(None, "injective", Target("plaingpu")) is gpu.schedule_gpu


def test_deprecated_knob_tables_are_views_of_the_kind_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu.TREE_MAX_OUTPUTS["cuda"] == 255 and gpu.SHARED_TAGS["cuda"]["dense"]
    monkeypatch.setitem(gpu.TREE_MAX_OUTPUTS, "opencl", 7)
    monkeypatch.setitem(gpu.SHARED_TAGS["opencl"], "matmul", True)
    t = Target("opencl")
    assert gpu.tree_max_outputs(t) == 7 and gpu.shared_tiles(t) == {"matmul"}
    monkeypatch.undo()
    assert Target("opencl").attrs["tree_max_outputs"] == 1 and Target("opencl").attrs["shared_tiles"] == []
    sel = gpu.SHARED_TAGS["cuda"]
    saved = dict(sel)
    sel.clear()
    assert not any(gpu.SHARED_TAGS["cuda"].values())
    sel.update(saved)
    assert Target("cuda").attrs["shared_tiles"] == ["dense", "matmul", "conv2d_nchw"]
