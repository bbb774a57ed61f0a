"""Whole models (built with onnx.helper) through kiln.build, checked against ONNX Runtime.

Each (model, target) is built once per session; the tests then check numerics in-process,
after export_library -> load_module in a fresh Python process, fusion structure, kernel
sharing, the memory plan and linked params.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import kiln
from tests.models.kiln_model_zoo import ATOL, MODELS, RTOL, run_factory, run_in_fresh_process, run_ort

TARGETS = ["c", "llvm"]
_CACHE: dict[tuple, Any] = {}


def _built(name: str, target: str, **kw: Any) -> tuple[Any, dict, list]:
    key = (name, target, tuple(sorted(kw.items())))
    if key not in _CACHE:
        model, feeds = MODELS[name]()
        mod, params = kiln.frontend.from_onnx(model)
        factory = kiln.build(mod, target=target, params=params, **kw)
        _CACHE[key] = (factory, feeds, run_ort(model, feeds))
    return _CACHE[key]


def _kernels(factory: Any) -> list[dict]:
    g = json.loads(factory.get_graph_json())
    return [n for n in g["nodes"] if n["op"] == "tvm_op" and n["attrs"]["func_name"] != "__nop"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_matches_onnxruntime(name: str, target: str) -> None:
    factory, feeds, ref = _built(name, target)
    out = run_factory(factory, feeds)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_export_and_load_in_fresh_process(name: str, target: str, tmp_path) -> None:
    factory, feeds, ref = _built(name, target)
    path = str(tmp_path / f"{name}.so")
    factory.export_library(path)
    out = run_in_fresh_process(path, feeds, str(tmp_path))
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL)


def test_cnn_fusion_and_sharing() -> None:
    factory, _, _ = _built("cnn", "llvm")
    kernels = _kernels(factory)
    funcs = [k["attrs"]["func_name"] for k in kernels]
    # conv + bn (folded into a bias) + relu is one kernel; with the residual add too (opt
    # level 3 runs the convs in the blocked NCHW[x]c layout, where the bias is a plain add; a
    # 3x3 stride-1 conv as Winograd, whose output transform carries the epilogue).
    convs = ("conv2d_nchwc", "winograd_output_transform")
    assert any(f"kilngen_default_fused_{c}_add_relu" in funcs for c in convs), funcs
    residual = [f for f in funcs if any(f == f"kilngen_default_fused_{c}_add_add_relu" for c in convs)]
    assert not any(f.endswith("_batch_norm") or "batch_norm" in f for f in funcs)
    # The two residual blocks have identical shapes: their kernels are emitted once each.
    assert len(residual) == 2 and len(set(residual)) == 1, funcs
    stats = factory.get_stats()
    assert stats["num_functions"] == len(set(funcs)) < stats["num_kernel_calls"] == len(funcs)
    lib_funcs = [f.name for f in factory.lowered.funcs]
    assert len(lib_funcs) == len(set(lib_funcs)) == len(set(funcs))
    # The flatten after global average pooling is an alias, not a kernel.
    g = json.loads(factory.get_graph_json())
    assert any(n.get("attrs", {}).get("func_name") == "__nop" for n in g["nodes"])


def test_cnn_memory_plan() -> None:
    factory, _, _ = _built("cnn", "c")
    plan = factory.memory_plan
    assert plan.planned_bytes < plan.no_reuse_bytes
    g = json.loads(factory.get_graph_json())
    sid = g["attrs"]["storage_id"][1]
    assert sid == plan.storage_ids
    # args (input + params) keep dedicated storage ids
    arg_sids = [sid[g["node_row_ptr"][n]] for n in g["arg_nodes"]]
    assert len(set(arg_sids)) == len(arg_sids)
    other = {s for i, s in enumerate(sid) if i not in {g["node_row_ptr"][n] for n in g["arg_nodes"]}}
    assert not other & set(arg_sids)


def test_mlp_and_dwsep_fusion() -> None:
    mlp, _, _ = _built("mlp", "c")
    funcs = [k["attrs"]["func_name"] for k in _kernels(mlp)]
    # fc1 and fc2 have different weight shapes: two kernels, the second name made unique.
    assert funcs == ["kilngen_default_fused_dense_bias_add_relu",
                     "kilngen_default_fused_dense_bias_add_relu_1",
                     "kilngen_default_fused_dense_bias_add"]
    # Unmodified initializers keep their ONNX names (fc1 / fc2's weights are stored as their
    # kernels' panels at build time: new params; fc3's one-row GEMV reads its weight as it is).
    assert {"fc1.bias", "fc3.weight"} <= set(mlp.get_params())
    assert "fc1.weight" not in mlp.get_params()
    dw, _, _ = _built("dwsep", "c")
    funcs = [k["attrs"]["func_name"] for k in _kernels(dw)]
    assert [f for f in funcs if "layout_transform" not in f] == [
        "kilngen_default_fused_conv2d_nchwc_add_clip", "kilngen_default_fused_conv2d_nchwc_add_relu"]


def test_transformer_structure() -> None:
    factory, _, _ = _built("transformer", "c")
    funcs = [k["attrs"]["func_name"] for k in _kernels(factory)]
    # Q, K and V projections have identical shapes: one kernel, three calls.
    qkv = [f for f in funcs if f == "kilngen_default_fused_dense_add"]
    assert len(qkv) == 3
    # GELU is fused into the first FFN matmul's epilogue.
    assert any(f.startswith("kilngen_default_fused_dense_add_divide_erf") for f in funcs)
    assert factory.get_stats()["num_functions"] < len(funcs)


@pytest.mark.parametrize("target", TARGETS)
def test_opt_level0_matches(target: str) -> None:
    factory, feeds, ref = _built("cnn", target, opt_level=0)
    out = run_factory(factory, feeds)
    np.testing.assert_allclose(out[0], ref[0], rtol=RTOL, atol=ATOL)
    assert len(_kernels(factory)) > len(_kernels(_built("cnn", target)[0]))


@pytest.mark.parametrize("target", TARGETS)
def test_link_params_round_trip(target: str, tmp_path) -> None:
    from kiln.driver import load_linked_params

    factory, feeds, ref = _built("mlp", target, link_params=True)
    assert factory.get_params() == {}
    linked = load_linked_params(factory)
    unlinked = _built("mlp", target)[0].get_params()
    assert sorted(linked) == sorted(unlinked)
    for k, v in unlinked.items():
        np.testing.assert_array_equal(linked[k], v.numpy())
    out = run_factory(factory, feeds, params=linked)
    np.testing.assert_allclose(out[0], ref[0], rtol=RTOL, atol=ATOL)
    path = str(tmp_path / "mlp_linked.so")
    factory.export_library(path)
    out = run_in_fresh_process(path, feeds, str(tmp_path), linked=True)
    np.testing.assert_allclose(out[0], ref[0], rtol=RTOL, atol=ATOL)


def test_link_params_picked_up_by_executor(tmp_path) -> None:
    """The executor binds linked params itself: zero copy, read-only, also after export."""
    from kiln.driver import load_linked_params

    factory, feeds, ref = _built("mlp", "c", link_params=True)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    ex = m.module
    assert m.get_num_inputs() == len(feeds)  # the weights are no longer inputs
    linked = load_linked_params(factory)
    assert linked and ex.linked == set(linked)
    lookup = factory.get_lib().get_function("_lookup_linked_param", query_imports=True)
    for name in linked:  # zero copy: the entry is the library's constant data itself
        eid = ex.arg_eid[name]
        assert ex.arrays[eid].numpy(copy=False).ctypes.data == int(lookup(name))
        np.testing.assert_array_equal(m.get_input(name).numpy(), linked[name])
    m.set_input(**feeds)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), ref[0], rtol=RTOL, atol=ATOL)
    # overriding a linked param gives that entry its own memory; the library data is untouched
    name = sorted(linked)[0]
    m.set_input(name, np.zeros_like(linked[name]))
    assert name not in ex.linked
    assert ex.arrays[ex.arg_eid[name]].numpy(copy=False).ctypes.data != int(lookup(name))
    m.run()
    assert not np.allclose(m.get_output(0).numpy(), ref[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(load_linked_params(factory)[name], linked[name])
    m.set_input(name, linked[name])
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), ref[0], rtol=RTOL, atol=ATOL)
    path = str(tmp_path / "mlp_linked_auto.so")
    factory.export_library(path)
    m2 = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))
    m2.run(**feeds)
    np.testing.assert_allclose(m2.get_output(0).numpy(), ref[0], rtol=RTOL, atol=ATOL)
