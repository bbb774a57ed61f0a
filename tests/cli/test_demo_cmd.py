"""``kiln demo`` as a subprocess, and the packaged demo model."""

from __future__ import annotations

import os

import pytest

from tests.cli.cli_support import assert_user_error, kiln
from tests.repo_scripts import load_repo_script

DATA = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "src", "kiln", "data", "demo_cnn.onnx")


def test_demo_model_ships_and_is_small():
    from kiln.cli.demo_cmd import demo_model_path

    path = demo_model_path()
    assert os.path.isfile(path)
    assert os.path.getsize(path) < 300 * 1024


def test_demo_model_matches_generator():
    pytest.importorskip("onnx")
    make_demo_model = load_repo_script("tools/make_demo_model.py")
    if make_demo_model is None:
        pytest.skip("tools/ not in this checkout")
    from kiln.cli.demo_cmd import demo_model_path

    with open(demo_model_path(), "rb") as f:
        assert f.read() == make_demo_model.build_model().SerializeToString()


def test_demo_runs_and_verifies(tmp_path):
    keep = str(tmp_path / "demo.so")
    proc = kiln("demo", "--repeat", "5", "--keep", keep, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "verified:" in out
    assert "latency median" in out and "build" in out and "max error" in out
    assert "kiln.ir.evaluate" in out
    assert os.path.isfile(keep)
    assert os.listdir(tmp_path) == ["demo.so"]  # nothing else left behind


def test_demo_unknown_target():
    assert_user_error(kiln("demo", "--target", "quantum"), "quantum")
