"""``kiln inspect`` on ONNX models and ``--graph`` drawings (SVG with graphviz, else DOT)."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("onnx")
from tests.cli.cli_support import assert_user_error, bad_op_model, kiln, tiny_model  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect_graph")
    model = tiny_model(str(d / "tiny.onnx"))
    lib = str(d / "tiny.so")
    proc = kiln("build", model, "-o", lib, "-q")
    assert proc.returncode == 0, proc.stderr
    return model, lib


def check_drawing(path: str, min_clusters: int) -> None:
    if path.endswith(".svg"):
        root = ET.parse(path).getroot()
        assert root.tag == SVG + "svg"
        groups = list(root.iter(SVG + "g"))
        clusters = [g for g in groups if g.get("class") == "cluster"]
        nodes = [g for g in groups if g.get("class") == "node"]
    else:
        text = open(path, encoding="utf-8").read()
        assert text.startswith("digraph")
        clusters = re.findall(r"subgraph cluster_\w+", text)
        nodes = re.findall(r"^\s+\w+ \[.*label=", text, re.M)
        assert "->" in text
    assert len(clusters) >= min_clusters
    assert len(nodes) > len(clusters)


def test_inspect_onnx_summary(built):
    model, _ = built
    proc = kiln("inspect", model)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "x: float32 [1, 3, 8, 8]" in out and "y: float32 [1, 5]" in out
    assert "Conv 1" in out and "Softmax 1" in out
    assert "all 6 op types are supported" in out


def test_inspect_onnx_ir_plan_json(built):
    model, _ = built
    proc = kiln("inspect", model, "--ir", "--plan", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["op_counts"]["Conv"] == 1
    assert "conv2d(" in info["ir"] and "softmax(" in info["ir"]
    assert info["plan"]["kernel_calls"] >= 1 and info["plan"]["memory"]["no_reuse_bytes"] > 0


def test_inspect_unsupported_ops_listed(tmp_path):
    bad = bad_op_model(str(tmp_path / "bad.onnx"))
    proc = kiln("inspect", bad)
    assert proc.returncode == 0, proc.stderr
    assert "UNSUPPORTED op types: FrobnicateX" in proc.stdout
    assert_user_error(kiln("inspect", bad, "--ir"), "FrobnicateX")


def test_inspect_library_shows_compiled_model(built):
    _, lib = built
    proc = kiln("inspect", lib)
    assert proc.returncode == 0, proc.stderr
    assert "GraphExecutorFactory" in proc.stdout
    assert "compiled model 'default'" in proc.stdout and "memory plan:" in proc.stdout


@pytest.mark.parametrize("source", ["model", "library"])
@pytest.mark.parametrize("ext", ["svg", "dot"])
def test_graph_drawing(built, tmp_path, source, ext):
    model, lib = built
    out = str(tmp_path / f"g.{ext}")
    proc = kiln("inspect", model if source == "model" else lib, "--graph", out)
    assert proc.returncode == 0, proc.stderr
    written = out
    if ext == "svg" and shutil.which("dot") is None:
        written = str(tmp_path / "g.dot")
        assert "graphviz 'dot' is not installed" in proc.stderr
    assert f"wrote {written}" in proc.stdout
    check_drawing(written, min_clusters=2)


def test_graph_errors(built, tmp_path):
    model, _ = built
    assert_user_error(kiln("inspect", model, "--graph", str(tmp_path / "g.bmp")), "format")
    assert_user_error(kiln("inspect", str(tmp_path / "none.onnx"), "--graph", str(tmp_path / "g.dot")), "not found")
    assert_user_error(kiln("inspect", model, "--input-shape", "x:1,3,q+1"), "--input-shape")
    assert_user_error(kiln("inspect", model, "--dim", "q=0..4"), "1 <= lo <= hi")


def test_svg_falls_back_to_dot_without_graphviz(built, tmp_path):
    import os
    import subprocess
    import sys

    model, _ = built
    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))  # no `dot` on PATH
    out = str(tmp_path / "g.svg")
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "inspect", model, "--graph", out],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "graphviz 'dot' is not installed" in proc.stderr
    assert not os.path.exists(out)
    check_drawing(str(tmp_path / "g.dot"), min_clusters=2)
