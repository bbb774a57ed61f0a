"""GFLOP/s of every blocked convolution in a ``kiln bench --profile`` report, against a peak.

    kiln bench bench/out/resnet50.onnx --threads 1 --profile | python bench/conv_flops.py --peak 272

FLOPs per kernel are 2 x MACs from the shapes the profile prints: a ``conv2d_nchwc`` weight is
``[O/ob, C/ib, KH, KW, ib, ob]`` (depthwise: ``ib`` 1), so MACs = output elements x
``C/ib x KH x KW x ib``. Prints each conv kernel (slowest first), the time-weighted GFLOP/s of
all of them, and the share of conv time that runs at >= 85% of ``--peak``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys


def parse(lines: list[str]) -> list[tuple[str, float, float]]:
    """``(kernel, microseconds, flops)`` of each ``conv2d_nchwc`` row of a profile table."""
    rows = []
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or "conv2d_nchwc" not in parts[0]:
            continue
        shapes = re.findall(r"\[[0-9, ]+\]", line)
        try:
            us = float(parts[2])
        except ValueError:
            continue
        if len(shapes) < 3:
            continue
        weight, out = ast.literal_eval(shapes[1]), ast.literal_eval(shapes[-1])
        if len(weight) != 6:
            continue
        elems = 1
        for d in out:
            elems *= d
        macs = elems * weight[1] * weight[2] * weight[3] * weight[4]
        rows.append((parts[0], us, 2.0 * macs))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", type=float, required=True, help="the machine's measured FP32 GEMM GFLOP/s")
    ap.add_argument("--top", type=int, default=20, help="kernels to list")
    args = ap.parse_args()
    rows = parse(sys.stdin.read().splitlines())
    if not rows:
        print("no conv2d_nchwc rows in the input (pipe `kiln bench MODEL --profile` into this)", file=sys.stderr)
        return 1
    total_us = sum(us for _, us, _ in rows)
    total_flops = sum(f for _, _, f in rows)
    fast = sum(us for _, us, f in rows if f / us / 1e3 >= 0.85 * args.peak)
    print(f"{'kernel':<60} {'us':>8} {'GFLOP/s':>8} {'% peak':>7}")
    for name, us, f in sorted(rows, key=lambda r: -r[1])[:args.top]:
        g = f / us / 1e3
        print(f"{name[:60]:<60} {us:8.1f} {g:8.1f} {100 * g / args.peak:6.1f}%")
    g = total_flops / total_us / 1e3
    print(f"{len(rows)} conv kernels, {total_us / 1e3:.2f} ms: time-weighted {g:.1f} GFLOP/s "
          f"({100 * g / args.peak:.0f}% of {args.peak:g}); {100 * fast / total_us:.0f}% of the conv time "
          f"at >= 85% of the peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
