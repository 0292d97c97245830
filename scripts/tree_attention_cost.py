"""Exact mode's attention for one layer of a draft tree's verify pass, per tree size: the
batch-invariant kernel (kernels/rows.cpp, all rows in one call) against each row computed
alone by PyTorch (exact.py's fallback where the kernel is unavailable), and a 1-row step for
scale, on SmolLM2's heads (9 over 3 of 64) in bfloat16, random trees over a prefix. Checks that
both give each row the same bits as its 1-token step.

    python scripts/tree_attention_cost.py [--past 600] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import partial

import torch

from specdec.kernels import invariant
from specdec.models.exact import TreeRows, attend_rows, exact_attend_row
from specdec.spec.verify import tree_attention_mask


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--past", type=int, default=600, help="cached tokens before the tree")
    ap.add_argument("--sizes", default="4,8,16,32", help="tree nodes (the root row comes on top)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    load = invariant.load
    print("rows | kernel us | rows alone us | 1-row step us (kernel)")
    for nodes in map(int, args.sizes.split(",")):
        parents = [-1] + [rng.randrange(-1, i) for i in range(nodes - 1)]
        tree = TreeRows(args.past, tree_attention_mask(parents))
        T = nodes + 1
        q = torch.randn(1, 9, T, 64, generator=g).bfloat16()
        k, v = (torch.randn(1, 3, args.past + T, 64, generator=g).bfloat16() for _ in range(2))
        call = partial(attend_rows, q, k, v, tree)
        step = partial(exact_attend_row, q[:, :, :1], k[:, :, :args.past + 1], v[:, :, :args.past + 1])
        with torch.inference_mode():
            kernel, one = call(), median_us(step, args.repeats)
            kernel_us = median_us(call, args.repeats)
            invariant.load = lambda: None
            try:
                alone = call()
                alone_us = median_us(call, args.repeats)
            finally:
                invariant.load = load
            for i, keys in enumerate(tree.positions):
                step_bits = exact_attend_row(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys])
                assert torch.equal(kernel[:, :, i:i + 1], step_bits)
        print(f"{T} | {kernel_us:.0f} | {alone_us:.0f} | {one:.0f}  (max |kernel - alone| "
              f"{(kernel.float() - alone.float()).abs().max():.1e})", flush=True)


if __name__ == "__main__":
    main()
