"""A/B of a compiled 1-token pass with and without row_attention's bf16-cache kernel, by the
number of cached tokens: two compiled copies of the target in one process, one traced with the
kernel switched off (the float32 copy of the cache and PyTorch's attention), timed in turns so
that drifts in this VM's speed hit both alike. Prints the median ms of a pass per context
length (best over the rounds) and the ratio.

    OMP_NUM_THREADS=2 python scripts/row_attention_ab.py --target smollm2 --dtype bfloat16
    OMP_NUM_THREADS=2 python scripts/row_attention_ab.py --target smollm2 --dtype bfloat16 --quantize int8
"""
from __future__ import annotations

import argparse
import json

import torch

from specdec.bench.pass_costs import median_pass_ms
from specdec.engine.loading import load_runner
from specdec.models import row_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantize", choices=("int8", "int4"))
    parser.add_argument("--lengths", default="50,150,300,600,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--order", default="kernel,copy", help="which copy loads (and compiles) first")
    parser.add_argument("--json")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    switch = {"kernel": row_attention.supports, "copy": lambda q, k: False}
    runners = {}
    for name in args.order.split(","):
        # a graph reads `supports` while it is traced (at its first pass) and guards on it:
        # each copy runs with the switch it was traced with
        row_attention.supports = switch[name]
        runners[name] = load_runner(args.target, args.dtype, compile=True, quantize=args.quantize)
        median_pass_ms(runners[name], 1, 3, cached=60)
        median_pass_ms(runners[name], 1, 3, cached=300)
    best = {(name, n): float("inf") for name in runners for n in lengths}
    for _ in range(args.rounds):
        for n in lengths:
            for name, runner in runners.items():
                row_attention.supports = switch[name]
                best[name, n] = min(best[name, n], median_pass_ms(runner, 1, args.repeats, cached=n))
    row_attention.supports = switch["kernel"]
    rows = []
    for n in lengths:
        copy, kernel = best["copy", n], best["kernel", n]
        rows.append({"cached": n, "copy_ms": round(copy, 2), "kernel_ms": round(kernel, 2),
                     "ratio": round(copy / kernel, 3)})
        print(f"{n:5d} cached tokens: float32 copy {copy:6.2f} ms, bf16 kernel {kernel:6.2f} ms, {copy / kernel:.3f}x")
    print("kernel:", "built" if row_attention.kernel_error() is None else row_attention.kernel_error())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
