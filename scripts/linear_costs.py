"""Milliseconds per product for the projections of a model's pass, per pass width: the
batch-invariant kernel (kernels/rows.cpp, exact mode's) against F.linear and oneDNN's packed
weight (where this CPU packs), alternating the candidates in one run, and the weight-streaming
bound from a measured read bandwidth (pass_costs.streaming_bandwidth). Shapes default to SmolLM2-135M's (30 layers).

    python scripts/linear_costs.py [--dtype bfloat16] [--threads 2] [--widths 1,2,4,8,16,32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specdec.bench.pass_costs import streaming_bandwidth
from specdec.kernels import build, invariant
from specdec.models.packed import pack_weight

SMOLLM2 = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # x30 layers
SMOLLM2_HEAD = (49152, 576)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(*shape, generator=g) * 0.02).to(dtype) for shape in SMOLLM2.values() for _ in range(30)]
    weights.append((torch.randn(*SMOLLM2_HEAD, generator=g) * 0.02).to(dtype))
    packed = [pack_weight(w) for w in weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    bound_ms = 1e3 * nbytes / streaming_bandwidth()
    print(f"{build.cpu_model()}; torch ISA {torch.backends.cpu.get_cpu_capability()}; {args.threads} threads; "
          f"{nbytes / 1e6:.0f} MB of {args.dtype} weights; streaming bound {bound_ms:.1f} ms a pass "
          f"(a large read); kernels: {build.unavailable() or 'built'}")
    candidates = {"invariant": lambda x, w, p: invariant.linear(x, w),
                  "F.linear": lambda x, w, p: F.linear(x, w)}
    if all(p is not None for p in packed):
        candidates["oneDNN packed"] = lambda x, w, p: p(x)
    print("rows | " + " | ".join(f"{name} ms" for name in candidates))
    with torch.inference_mode():
        for m in map(int, args.widths.split(",")):
            xs = {w.shape[1]: torch.randn(m, w.shape[1], generator=g).to(dtype) for w in weights}
            times = {name: [] for name in candidates}
            for _ in range(args.repeats):
                for name, fn in candidates.items():
                    t0 = time.perf_counter()
                    for w, p in zip(weights, packed):
                        fn(xs[w.shape[1]], w, p)
                    times[name].append(1e3 * (time.perf_counter() - t0))
            print(f"{m} | " + " | ".join(f"{statistics.median(t):.1f}" for t in times.values()), flush=True)


if __name__ == "__main__":
    main()
