"""``kiln.build_portable``: one library with a build per x86-64 level, the variant chosen at load
in Python and in C."""

from __future__ import annotations

import os
import platform
import subprocess

import numpy as np
import pytest

import kiln
from kiln.runtime import cpu_features
from kiln.runtime.errors import InputError, UnsupportedHostError
from kiln.runtime.isa_dispatch import FORCE_ENV, IsaDispatchModule
from tests.capi.test_c_api import EXAMPLE, _cc, _model, _outputs, _write_inputs

pytestmark = pytest.mark.skipif(cpu_features.machine_arch(platform.machine()) != "x86",
                                reason="x86-64 levels are built and run on an x86-64 host")

LEVELS = ["llvm -mcpu=x86-64-v2", "llvm -mcpu=x86-64-v4", "llvm -mcpu=x86-64-v3"]  # any order
#: The variants block channels by their vector width, so they sum in different orders, and the
#: 3x3 convs run as Winograd, whose transforms amplify float32 rounding (~2e-5 seen here).
_RTOL, _ATOL = 1e-4, 1e-5


def _expected_variant(variants) -> str:
    arch, host = cpu_features.host_cpu()
    if host is None:
        return variants[-1].mod_name
    return next(v.mod_name for v in variants if set(v.features) <= host)


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    onnx_model, feeds = _model("cnn")
    graph, params = kiln.frontend.from_onnx(onnx_model)
    mod = kiln.build_portable(graph, params=params, targets=LEVELS)
    ref = kiln.GraphModule(kiln.build(graph, params=params, target="llvm")["default"](kiln.cpu()))
    ref.set_input("x", feeds["x"])
    ref.run()
    tmp = str(tmp_path_factory.mktemp("portable"))
    lib = mod.export_library(os.path.join(tmp, "model.so"))
    return mod, lib, feeds, [ref.get_output(0).numpy()], tmp


def test_variants_ordered_best_first(portable):
    mod = portable[0]
    assert [v.mod_name for v in mod.variants] == ["default_x86_64_v4", "default_x86_64_v3", "default_x86_64_v2"]
    v4, v3, v2 = (set(v.features) for v in mod.variants)
    assert "avx512f" in v4 and "avx2" in v3 and "avx2" not in v2 and "sse4.2" in v2 and v2 < v3 < v4
    # the library's own requirement is the least demanding build's: it loads on any x86-64-v2 CPU
    assert mod.library_isa_requirement() == ("x86", sorted(v2))


def test_python_picks_the_best_runnable_variant(portable, monkeypatch):
    mod, lib, feeds, ref, _ = portable
    loaded = kiln.runtime.load_module(lib)
    assert isinstance(loaded, IsaDispatchModule)
    assert loaded.selected_variant() == _expected_variant(loaded.variants)
    m = kiln.GraphModule(loaded["default"](kiln.cpu()))
    m.set_input("x", feeds["x"])
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), ref[0], rtol=_RTOL, atol=_ATOL)
    # every variant this CPU can run gives the same answer
    host = cpu_features.host_cpu()[1] or frozenset()
    for v in loaded.variants:
        monkeypatch.setenv(FORCE_ENV, v.mod_name)
        if not set(v.features) <= host:
            with pytest.raises(UnsupportedHostError, match="lacks"):
                loaded["default"](kiln.cpu())
            continue
        m = kiln.GraphModule(loaded["default"](kiln.cpu()))
        m.set_input("x", feeds["x"])
        m.run()
        np.testing.assert_allclose(m.get_output(0).numpy(), ref[0], rtol=_RTOL, atol=_ATOL)
    monkeypatch.setenv(FORCE_ENV, "nope")
    with pytest.raises(InputError, match="names no variant"):
        loaded["default"](kiln.cpu())


def test_older_cpu_gets_the_baseline_variant(portable, monkeypatch):
    _, lib, *_ = portable
    v2_only = frozenset({"sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"})
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: ("x86", v2_only))
    loaded = kiln.runtime.load_module(lib)  # a -mcpu=native library would be refused here
    assert loaded.selected_variant() == "default_x86_64_v2"
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: ("x86", frozenset({"sse", "sse2"})))
    with pytest.raises(UnsupportedHostError):
        kiln.runtime.load_module(lib)


def test_c_api_picks_the_same_variant(portable):
    mod, lib, feeds, ref, tmp = portable
    exe = _cc(os.path.join(tmp, "run_model"), EXAMPLE, "-ldl")
    inputs = _write_inputs(tmp, feeds)
    host = cpu_features.host_cpu()[1] or frozenset()
    for v in [None, *mod.variants]:
        env = {"PATH": "/usr/bin:/bin"}
        if v is not None:
            env[FORCE_ENV] = v.mod_name
        proc = subprocess.run([exe, lib, *inputs, "--out", os.path.join(tmp, "o")], capture_output=True, text=True,
                              env=env, timeout=60)
        if v is not None and not set(v.features) <= host:
            assert proc.returncode == 8 and "lacks" in proc.stderr  # KILN_ERR_UNSUPPORTED, not SIGILL
            continue
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_allclose(_outputs(os.path.join(tmp, "o"), ref)[0], ref[0], rtol=_RTOL, atol=_ATOL)


def test_cli_isa_levels(tmp_path, capsys):
    import onnx

    from kiln.cli import main

    onnx_model, feeds = _model("cnn")
    src = os.path.join(str(tmp_path), "cnn.onnx")
    onnx.save(onnx_model, src)
    out = os.path.join(str(tmp_path), "cnn.so")
    assert main(["build", src, "-o", out, "-q", "--target", "llvm", "--isa-levels", "v2,v3"]) == 0
    loaded = kiln.runtime.load_module(out)
    assert [v.mod_name for v in loaded.variants] == ["default_x86_64_v3", "default_x86_64_v2"]
    m = kiln.GraphModule(loaded["default"](kiln.cpu()))
    m.set_input("x", feeds["x"])
    m.run()
    assert np.isfinite(m.get_output(0).numpy()).all()
    assert main(["build", src, "-o", out, "-q", "--isa-levels", "v2,v3", "--params-file", out + ".params"]) == 1
    assert "--params-file cannot be combined with --isa-levels" in capsys.readouterr().err
