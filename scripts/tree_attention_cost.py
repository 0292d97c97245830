"""Exact mode's attention for one layer of a draft tree's verify pass, per tree size: the
tree rows together (exact.attend_tree, what attend_rows runs where its check passes) against
each row gathering its own keys (the form it falls back to), on SmolLM2's heads (9 over 3 of
64) in bfloat16, random trees over a prefix. Checks that both give the same bits.

    OMP_NUM_THREADS=2 python scripts/tree_attention_cost.py [--past 600] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import partial

import torch

from specdec.models.exact import TreeRows, attend_rows
from specdec.verify import tree_attention_mask


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
    print("rows | together us | rows alone us | ratio")
    for nodes in map(int, args.sizes.split(",")):
        parents = [-1] + [rng.randrange(-1, i) for i in range(nodes - 1)]
        tree = TreeRows(args.past, tree_attention_mask(parents))
        T = nodes + 1
        q = torch.randn(1, 9, T, 64, generator=g).bfloat16()
        k, v = (torch.randn(1, 3, args.past + T, 64, generator=g).bfloat16() for _ in range(2))
        together_call = partial(attend_rows, q, k, v, tree)
        alone_call = partial(attend_rows, q, k, v, tree.positions)
        with torch.inference_mode():
            assert torch.equal(together_call(), alone_call())
            together, alone = median_us(together_call, args.repeats), median_us(alone_call, args.repeats)
        print(f"{T} | {together:.0f} | {alone:.0f} | {alone / together:.1f}x", flush=True)


if __name__ == "__main__":
    main()
