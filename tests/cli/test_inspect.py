"""``kiln inspect`` on .so and .tar libraries, run as a separate process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import kiln.runtime as rt
from kiln.runtime.module import Module

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t alpha(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
KILN_DLL int32_t beta(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


class Weights(Module):
    """Serializable test module; inspect must not need its loader (nothing is loaded)."""

    type_key = "test_inspect_weights"

    def save_to_binary(self) -> bytes:
        return b"w" * 1000


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    root = rt.csource_module(KERNEL, ["alpha", "beta"])
    root.import_module(Weights())
    return root.export_library(str(d / "m.so")), root.export_library(str(d / "m.tar"))


def kiln_cmd() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "kiln")
    if not os.path.exists(script):
        script = shutil.which("kiln") or ""
    if not script:
        pytest.skip("kiln console script not installed")
    return [script]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("which", [0, 1], ids=["so", "tar"])
@pytest.mark.parametrize("launcher", ["module", "script"])
def test_inspect_shows_tree_and_functions(libs, which, launcher):
    cmd = [sys.executable, "-m", "kiln.cli"] if launcher == "module" else kiln_cmd()
    proc = run(cmd + ["inspect", libs[which]])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "functions (2): alpha, beta" in out
    assert "[0] _lib" in out and "[1] test_inspect_weights  (payload 1000 B)" in out
    assert "row_ptr=[0, 1, 1] child_indices=[1]" in out


def test_inspect_json(libs):
    proc = run([sys.executable, "-m", "kiln.cli", "inspect", "--json", libs[0]])
    info = json.loads(proc.stdout)
    assert info["kind"] == "so" and info["has_crt"] and info["functions"] == ["alpha", "beta"]
    assert [e["type_key"] for e in info["blob"]["entries"]] == ["_lib", "test_inspect_weights"]
    assert info["blob"]["entries"][1]["payload_bytes"] == 1000


def test_inspect_missing_file_one_line_error(tmp_path):
    proc = run([sys.executable, "-m", "kiln.cli", "inspect", str(tmp_path / "nope.so")])
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("kiln: error: no such file") and proc.stderr.count("\n") == 1
    proc = run(kiln_cmd() + ["--verbose", "inspect", str(tmp_path / "nope.so")])
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_inspect_not_a_library(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_text("hello")
    proc = run([sys.executable, "-m", "kiln.cli", "inspect", str(bad)])
    assert proc.returncode == 1 and "not an ELF file" in proc.stderr


def test_main_in_process(libs, capsys):
    from kiln.cli import main

    assert main(["inspect", libs[0]]) == 0
    assert "alpha" in capsys.readouterr().out
    assert main([]) == 2


def test_inspect_runs_no_library_code(tmp_path):
    marker = tmp_path / "ran"
    code = KERNEL + (
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void boom(void) {\n"
        f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    root = rt.csource_module(code, ["alpha", "beta"])
    root.import_module(Weights())
    path = root.export_library(str(tmp_path / "ctor.so"))
    proc = run([sys.executable, "-m", "kiln.cli", "inspect", path])
    assert proc.returncode == 0 and "test_inspect_weights" in proc.stdout
    assert not marker.exists()
