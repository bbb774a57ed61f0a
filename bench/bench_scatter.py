"""ScatterElements and ScatterND: Kiln's CPU loop kernels against ONNX Runtime, interleaved.

Each case is a one-node ONNX graph (data, indices and updates as inputs) built by Kiln and run
by both engines on the same inputs; the outputs must agree (exactly for a plain scatter, to the
usual tolerance for reductions), then the engines are timed interleaved
(:func:`common.interleaved`) and the medians printed in us. The cases are the shapes the kernels
were written for: Faster R-CNN's RoI-pooling scatter, a KV-cache row write, many scalar
updates. These are the figures of ``docs/topi.md`` (loop-IR kernels).

Usage::

    python bench/bench_scatter.py [--threads 1] [--rounds 5] [--cases roi,kv,scalars,axis0_add]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

RNG = np.random.default_rng(0)


def _roi() -> tuple[str, dict, dict[str, np.ndarray]]:
    # torchvision's MultiScaleRoIAlign writes each level's pooled boxes back by their rows
    x = np.zeros((150, 256, 7, 7), np.float32)
    rows = RNG.permutation(150)[:100].astype(np.int64)
    idx = np.broadcast_to(rows[:, None, None, None], (100, 256, 7, 7)).copy()
    return "ScatterElements", {"axis": 0}, {"x": x, "i": idx, "u": RNG.standard_normal(idx.shape).astype(np.float32)}


def _axis0_add() -> tuple[str, dict, dict[str, np.ndarray]]:
    idx = RNG.integers(-1000, 1000, (1000, 4)).astype(np.int64)
    return "ScatterElements", {"axis": 0, "reduction": "add"}, {
        "x": RNG.standard_normal((1000, 4)).astype(np.float32), "i": idx,
        "u": RNG.standard_normal((1000, 4)).astype(np.float32)}


def _kv() -> tuple[str, dict, dict[str, np.ndarray]]:
    idx = np.stack([np.zeros(16, np.int64), RNG.integers(0, 8, 16), RNG.integers(0, 1024, 16)], -1)
    return "ScatterND", {}, {"x": RNG.standard_normal((1, 8, 1024, 64)).astype(np.float32), "i": idx,
                             "u": RNG.standard_normal((16, 64)).astype(np.float32)}


def _scalars() -> tuple[str, dict, dict[str, np.ndarray]]:
    idx = RNG.integers(-100000, 100000, (10000, 1)).astype(np.int64)
    return "ScatterND", {}, {"x": RNG.standard_normal(100000).astype(np.float32), "i": idx,
                             "u": RNG.standard_normal(10000).astype(np.float32)}


#: name -> (label, builder of (op type, attributes, feeds))
CASES = {
    "roi": ("ScatterElements (150, 256, 7, 7), 100 rows on axis 0", _roi),
    "axis0_add": ("ScatterElements add (1000, 4), 1000 x 4 updates on axis 0", _axis0_add),
    "kv": ("ScatterND (1, 8, 1024, 64), 16 rows (k = 3)", _kv),
    "scalars": ("ScatterND (100000,), 10000 scalars (k = 1)", _scalars),
}


def onnx_model(op: str, attrs: dict, feeds: dict[str, np.ndarray]) -> bytes:
    from onnx import helper, numpy_helper

    def info(name: str, arr: np.ndarray) -> Any:
        return helper.make_tensor_value_info(name, numpy_helper.from_array(arr[:0].reshape(-1)).data_type,
                                             list(arr.shape))

    node = helper.make_node(op, ["x", "i", "u"], ["y"], **attrs)
    graph = helper.make_graph([node], "scatter", [info(k, v) for k, v in feeds.items()], [info("y", feeds["x"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    common.add_run_args(ap)
    args = ap.parse_args()
    common.run_header(args, "bench_scatter.py")
    import kiln

    rows = []
    for case in args.cases.split(","):
        label, make = CASES[case]
        op, attrs, feeds = make()
        model = onnx_model(op, attrs, feeds)
        graph, params = kiln.frontend.from_onnx(model)
        gm = kiln.GraphModule(kiln.build(graph, target=args.target, params=params)["default"](kiln.cpu()))
        common.kiln_set_threads(gm.module.lib, args.threads)
        with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
            f.write(model)
            f.flush()
            sess = common.ort_session(f.name, args.threads)
        gm.set_input(**feeds)
        gm.run()
        want = sess.run(None, feeds)[0]
        if "reduction" in attrs:
            np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5, err_msg=case)
        else:
            np.testing.assert_array_equal(gm.get_output(0).numpy(), want, err_msg=case)
        engines = [common.Engine("kiln", gm.run), common.Engine("ort", lambda s=sess, f=feeds: s.run(None, f))]
        if args.wait_quiet > 0:
            common.wait_quiet(args.max_foreign, args.wait_quiet, print)
        load: dict = {}
        t = common.interleaved(engines, rounds=args.rounds, log=lambda m: print(m, file=sys.stderr), info=load)
        k, o = t["kiln"].median, t["ort"].median
        rows.append([label, f"{k * 1e6:.1f}", f"{o * 1e6:.1f}", f"{k / o:.2f}x", common.median_load(load)])
    print(common.md_table(["case (us, median)", "Kiln", "ORT", "Kiln / ORT", "other load"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
