"""Host <-> device traffic of a dynamic device graph: ``set_input`` and ``get_output``.

Usage::

    python bench/bench_dynamic_copy.py [--seqs 8,64,512] [--repeats 50] [--device cuda]

Builds ``dense(relu(x + b))`` over ``x: (4, seq, 384)``, ``seq`` in 1..512, for ``opencl``
(PoCL on the CPU: its "device" memory is host memory, so a copy costs a memcpy plus the
driver call), runs it once at each ``seq`` and times, apart, ``set_input`` (the input copied
into the device's padded storage) and ``get_output`` (the output copied back). A Kiln that moves the whole padded
storage each way pays for ``seq`` = 512 at every size; one that moves the valid box pays for
the actual size. Run it with two trees (``PYTHONPATH=<tree>/src``) to compare them.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

import kiln
from kiln import ir


def build(target: str) -> kiln.runtime.Module:
    """The library: batch 4, dynamic ``seq`` in 1..512, 384 features."""
    rng = np.random.default_rng(0)
    g = ir.Graph("bench")
    g.declare_dim("seq", 1, 512)
    x = g.add_input("x", (4, "seq", 384))
    b = g.add_constant(rng.standard_normal(384).astype("float32"))
    w = g.add_constant((rng.standard_normal((384, 384)) * 0.05).astype("float32"))
    g.outputs = [g.add("dense", g.add("relu", g.add("add", x, b)), w)]
    return kiln.build(g, target=target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="8,64,512")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--device", default="opencl", choices=["opencl", "cuda"])
    args = ap.parse_args()
    dev = kiln.device(args.device)
    if not dev.exist:
        raise SystemExit(f"no {args.device} device (for OpenCL: install ocl-icd-libopencl1 and pocl-opencl-icd)")
    m = kiln.GraphModule(build(args.device)["default"](dev))
    rng = np.random.default_rng(1)
    print(f"# {platform.processor() or platform.machine()}, {args.device}, kiln from {kiln.__file__}")
    for seq in (int(s) for s in args.seqs.split(",")):
        x = rng.standard_normal((4, seq, 384)).astype(np.float32)
        t_in, t_out = [], []
        m.set_input(x=x)
        m.run()
        for _ in range(args.repeats + 3):
            t = time.perf_counter()
            m.set_input(x=x)
            t_in.append(time.perf_counter() - t)
            t = time.perf_counter()
            y = m.get_output(0)
            t_out.append(time.perf_counter() - t)
        assert y.shape == (4, seq, 384)
        print(f"seq {seq:4d}: set_input {statistics.median(t_in[3:]) * 1e3:.3f} ms, get_output "
              f"{statistics.median(t_out[3:]) * 1e3:.3f} ms (valid {x.nbytes / 1e6:.2f} MB of "
              f"{4 * 512 * 384 * 4 / 1e6:.2f} MB padded)")

if __name__ == "__main__":
    main()
