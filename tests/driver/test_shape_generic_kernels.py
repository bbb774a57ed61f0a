"""Shape-generic kernels: elementwise groups that differ only in the extent of their first
non-unit axis (DenseNet's BatchNorm + ReLU, one per channel count) share one kernel that reads
the extent at run time; groups nobody shares with stay specialised."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Graph, evaluate

F32 = "float32"


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


def _dense_block(rng: np.random.Generator, layers: int, batch: int = 1) -> Graph:
    g = Graph("dense_block")
    x = g.add_input("x", (batch, 8, 6, 6))
    feat = g.add("relu", g.add("conv2d", x, g.add_constant(_rand(rng, 16, 8, 3, 3)), padding=(1, 1, 1, 1)))
    c = 16
    for _ in range(layers):
        h = g.add("multiply", feat, g.add_constant(_rand(rng, 1, c, 1, 1, scale=1.0)))
        h = g.add("relu", g.add("add", h, g.add_constant(_rand(rng, 1, c, 1, 1))))
        y = g.add("conv2d", h, g.add_constant(_rand(rng, 8, c, 3, 3)), padding=(1, 1, 1, 1))
        feat = g.add("concatenate", feat, y, axis=1)
        c += 8
    g.outputs = [g.add("conv2d", g.add("relu", feat), g.add_constant(_rand(rng, 8, c, 1, 1)))]
    return g


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_bn_relu_of_every_channel_count_shares_one_kernel(target: str) -> None:
    rng = np.random.default_rng(0)
    g = _dense_block(rng, layers=4)
    factory = kiln.build(g, target=target)
    calls = [c.func_name for c in factory.lowered.calls if c.func_name.split("_fused_")[-1].startswith("multiply_add")]
    assert len(calls) == 4, calls
    # the first layer's input has another channel block (16) than the later ones (8); the
    # three later layers (24, 32, 40 channels) share one kernel
    shared = max(set(calls), key=calls.count)
    assert calls.count(shared) == 3, calls
    func = next(f for f in factory.lowered.funcs if f.name == shared)
    assert func.dyn_vars
    assert all(not f.dyn_vars for f in factory.lowered.funcs if f.name != shared)
    x = _rand(rng, 1, 8, 6, 6, scale=1.0)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_batch_two_keeps_kernels_specialised() -> None:
    """The axis before the channels is 2: a varying channel count would change strides."""
    rng = np.random.default_rng(1)
    g = _dense_block(rng, layers=3, batch=2)
    factory = kiln.build(g, target="llvm")
    assert all(not f.dyn_vars for f in factory.lowered.funcs)
    x = _rand(rng, 2, 8, 6, 6, scale=1.0)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_shape_nobody_shares_stays_static() -> None:
    g = Graph("two_relus")
    x = g.add_input("x", (1, 32, 4, 4))
    a = g.add("relu", g.add("add", x, g.add_constant(np.ones((1, 32, 1, 1), F32))))
    b = g.add("relu", g.add("add", g.add("exp", a), g.add_constant(np.ones((1, 32, 1, 1), F32))))
    g.outputs = [a, b]
    factory = kiln.build(g, target="llvm")
    assert all(not f.dyn_vars for f in factory.lowered.funcs)


def test_exported_library_runs_the_shared_kernel_in_a_fresh_module(tmp_path) -> None:
    rng = np.random.default_rng(2)
    g = _dense_block(rng, layers=3)
    factory = kiln.build(g, target="llvm")
    assert any(f.dyn_vars for f in factory.lowered.funcs)
    lib = kiln.runtime.load_module(factory.export_library(str(tmp_path / "block.so")))
    x = _rand(rng, 1, 8, 6, 6, scale=1.0)
    m = kiln.GraphModule(lib["default"](kiln.cpu()))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)
