"""FusePatterns off vs on: the fused ``rms_norm`` / ``gelu(approximate="tanh")`` kernels against
the elementwise chains they replace, timed interleaved in one process (the machine may be
shared).

Usage::

    python bench/bench_fuse_patterns.py [--target "llvm -mcpu=native"] [--models]

``--models`` also times tiny ``transformers`` Llama and GPT-2 models (2 layers, hidden 512,
sequence 128, random weights) built through ``kiln.frontend.from_torch``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

import kiln
from kiln.ir import Graph

_C1 = math.sqrt(2 / math.pi)


def _rms(g: Graph, x, d: int):
    sq = g.add("multiply", x, x)
    ms = g.add("reduce_mean", sq, axes=(-1,), keepdims=True)
    rs = g.add("rsqrt", g.add("add", ms, g.add_constant(np.float32(1e-6))))
    w = g.add_constant(np.random.default_rng(0).random(d).astype(np.float32) + 0.5)
    return g.add("multiply", w, g.add("multiply", x, rs))


def _gelu(g: Graph, x, d: int, pow3: bool = False):
    def c(v: float):
        return g.add_constant(np.float32(v))

    cube = g.add("power", x, c(3.0)) if pow3 else g.add("multiply", g.add("multiply", x, x), x)
    inner = g.add("multiply", c(_C1), g.add("add", x, g.add("multiply", c(0.044715), cube)))
    return g.add("multiply", g.add("multiply", c(0.5), x), g.add("add", c(1.0), g.add("tanh", inner)))


KINDS = {"rms": _rms, "gelu_xxx": _gelu, "gelu_pow3": lambda g, x, d: _gelu(g, x, d, True)}


def _with_pass(enabled: bool) -> None:
    if enabled:
        os.environ.pop("KILN_DISABLE_PASSES", None)
    else:
        os.environ["KILN_DISABLE_PASSES"] = "FusePatterns"


def _module(g: Graph, target: str, enabled: bool, params=None):
    _with_pass(enabled)
    calls = len(kiln.driver.lower(g, target, params=params).calls)
    return calls, kiln.GraphModule(kiln.build(g, target=target, params=params)["default"](kiln.cpu()))


def _interleaved(a, b, rounds: int, number: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(a.benchmark(repeat=3, number=number).median)
        tb.append(b.benchmark(repeat=3, number=number).median)
    return float(np.median(ta)), float(np.median(tb))


def bench_ops(target: str) -> None:
    for kind, build in KINDS.items():
        for shape in ((64, 4096), (1024, 4096)):
            mods = []
            for enabled in (False, True):
                g = Graph(kind)
                x = g.add_input("x", shape, "float32")
                g.outputs = [build(g, x, shape[-1])]
                n, m = _module(g, target, enabled)
                m.set_input("x", np.random.default_rng(1).standard_normal(shape).astype(np.float32))
                mods.append((n, m))
            a, b = _interleaved(mods[0][1], mods[1][1], rounds=7, number=10)
            print(f"{kind} {shape}: chain {mods[0][0]} call(s) {a * 1e3:.3f} ms | fused {mods[1][0]} call(s) "
                  f"{b * 1e3:.3f} ms | chain/fused {a / b:.2f}x", flush=True)


def bench_models(target: str) -> None:
    import torch

    try:  # a torchvision built for another torch breaks transformers' imports; these models need none
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means it is unusable
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules["torchvision"] = None  # type: ignore[assignment]
    import transformers as tf

    torch.manual_seed(0)
    h = 512
    models = {
        "llama": tf.LlamaModel(tf.LlamaConfig(vocab_size=1000, hidden_size=h, intermediate_size=4 * h,
                                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                              max_position_embeddings=256, use_cache=False)),
        "gpt2": tf.GPT2Model(tf.GPT2Config(vocab_size=1000, n_embd=h, n_layer=2, n_head=8, n_positions=256,
                                           use_cache=False, bos_token_id=0, eos_token_id=0)),
    }
    for name, model in models.items():
        model.eval()
        ids = torch.randint(0, 1000, (1, 128))
        g, p = kiln.frontend.from_torch(model, (ids,))
        with torch.no_grad():
            want = model(ids)[0].numpy()
        mods = []
        for enabled in (False, True):
            n, m = _module(g, target, enabled, p)
            m.set_input(g.inputs[0].name, ids.numpy())
            m.run()
            err = float(np.abs(m.get_output(0).numpy() - want).max() / np.abs(want).max())
            mods.append((n, m, err))
        a, b = _interleaved(mods[0][1], mods[1][1], rounds=5, number=5)
        print(f"{name} hidden {h} seq 128: chain {mods[0][0]} calls {a * 1e3:.3f} ms (rel err {mods[0][2]:.1e}) | "
              f"fused {mods[1][0]} calls {b * 1e3:.3f} ms (rel err {mods[1][2]:.1e}) | {a / b:.2f}x", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm -mcpu=native")
    ap.add_argument("--models", action="store_true")
    args = ap.parse_args()
    bench_ops(args.target)
    if args.models:
        bench_models(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
