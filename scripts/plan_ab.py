"""Exact-mode pass cost under two plans (reduction chunk x minimum rows, see
exact.row_invariant_plan) for every projection of one input width, alternating in one
process (this VM's speed drifts by 10-20% between processes): SmolLM2 bf16, ms per pass of
T tokens over a 400-token cache, median over rounds.

    OMP_NUM_THREADS=2 python scripts/plan_ab.py --width 1536 --plans 1024x1,1536x4
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdec
from specdec.models import exact


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--width", type=int, default=1536, help="input width of the projections whose plan changes")
    ap.add_argument("--plans", default="1024x1,1536x4")
    ap.add_argument("--tokens", default="1,5,17", help="pass widths")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    plans = [tuple(int(x) for x in p.split("x")) for p in args.plans.split(",")]
    runner = specdec.load(target=args.target, dtype="bfloat16", calibrate=False).engine.target
    context = list(range(1000, 1400))
    runner.reset()
    runner.extend(context, want_logits=False)
    runner.extend([5], exact=True)  # plans every projection
    keys = [k for k in exact._weight_plans if k[1][1] == args.width]
    print(f"{len(keys)} projections of width {args.width}; chosen here: {exact._weight_plans[keys[0]]}")
    times: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for plan in plans:
            for key in keys:
                exact._weight_plans[key] = plan
            for T in map(int, args.tokens.split(",")):
                for timed in (False, True):
                    t0 = time.perf_counter()
                    for _ in range(10 if timed else 3):
                        runner.extend([5] * T, exact=True)
                        runner.rollback(len(context))
                    if timed:
                        times.setdefault((T, plan), []).append((time.perf_counter() - t0) / 10 * 1e3)
    for (T, plan), values in sorted(times.items()):
        print(f"T={T} plan {plan[0]}x{plan[1]}: {statistics.median(values):.2f} ms")


if __name__ == "__main__":
    main()
