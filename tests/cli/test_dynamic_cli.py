"""The CLI with dynamic dimensions: build with --dim, inspect shows the symbols, run accepts
any in-range input and refuses the rest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli.cli_support import assert_user_error, kiln, tiny_model


@pytest.fixture(scope="module")
def dynamic_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("dyn_cli")
    model = tiny_model(str(d / "tiny.onnx"), batch="N")  # the model's own dim_param
    lib = str(d / "tiny.so")
    proc = kiln("build", model, "-o", lib, "--dim", "N=1..6", "-q")
    assert proc.returncode == 0, proc.stderr
    return d, model, lib


def test_inspect_library_shows_symbolic_dims(dynamic_lib):
    _, _, lib = dynamic_lib
    proc = kiln("inspect", lib)
    assert proc.returncode == 0, proc.stderr
    assert "float32 [N, 3, 8, 8]" in proc.stdout and "float32 [N, 5]" in proc.stdout
    assert "dynamic dims: N in 1..6" in proc.stdout
    info = json.loads(kiln("inspect", lib, "--json").stdout)
    assert info["compiled_model"]["dim_ranges"] == {"N": [1, 6]}


@pytest.mark.parametrize("batch", [1, 4, 6])
def test_run_accepts_every_batch_in_range(dynamic_lib, batch):
    d, _, lib = dynamic_lib
    x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype("float32")
    np.save(d / f"x{batch}.npy", x)
    out = d / f"y{batch}.npz"
    proc = kiln("run", lib, "--input", f"x={d / f'x{batch}.npy'}", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    y = np.load(out)
    (arr,) = y.values()
    assert arr.shape == (batch, 5)
    np.testing.assert_allclose(arr.sum(-1), 1.0, rtol=1e-5)


def test_run_refuses_a_batch_out_of_range(dynamic_lib):
    d, _, lib = dynamic_lib
    np.save(d / "x9.npy", np.zeros((9, 3, 8, 8), "float32"))
    assert_user_error(kiln("run", lib, "--input", f"x={d / 'x9.npy'}"), "outside its range 1..6")


def test_named_dim_from_the_command_line(tmp_path):
    model = tiny_model(str(tmp_path / "static.onnx"))  # static batch 1 in the model
    lib = str(tmp_path / "named.so")
    proc = kiln("build", model, "-o", lib, "--input-shape", "x:b,3,8,8", "--dim", "b=1..3", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "dynamic dims: b in 1..3" in kiln("inspect", lib).stdout


def test_a_named_dim_without_a_range_is_a_user_error(tmp_path):
    model = tiny_model(str(tmp_path / "static.onnx"))
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--input-shape", "x:b,3,8,8"), "'b'")
