"""Greedy decoding's tokens/s with two kernels of one variant (kernels/variants.py), switched prompt by
prompt in one process, the order turning each round, so that the VM's drift falls on both alike. Each
method's decoder is loaded (and calibrated) once, on the kernel this machine chose.

    python scripts/variant_e2e.py dp_tail split whole [smollm2] [draft,eagle,ngram] [prompts] [rounds]
"""
import sys
import time

import torch

import specdec
from specdec.data.prompts import build_suite
from specdec.kernels import build, variants


def main() -> None:
    name, first, second = sys.argv[1:4]
    target = sys.argv[4] if len(sys.argv) > 4 else "smollm2"
    methods = (sys.argv[5] if len(sys.argv) > 5 else "draft,eagle,ngram").split(",")
    n_prompts, rounds = (int(sys.argv[6]) if len(sys.argv) > 6 else 6), (int(sys.argv[7]) if len(sys.argv) > 7 else 2)
    torch.set_num_threads(2)
    lib = build.load()
    variant = next(v for v in variants.VARIANTS if v.name == name)
    prompts = [q.text for q in build_suite(n_prompts, ["code"])][:n_prompts]
    print(f"{target} bfloat16, {name}: {first} / {second}, {n_prompts} code prompts x 128 tokens x {rounds} rounds,"
          " T=0")
    for method in methods:
        decoder = specdec.load(target=target, method=method, dtype="bfloat16", calibrate=True)
        decoder.generate(prompts[0], max_new_tokens=32, temperature=0)  # warm
        totals = {first: [0, 0.0], second: [0, 0.0]}
        for r in range(rounds):
            for prompt in prompts:
                for kernel in ((first, second) if r % 2 == 0 else (second, first)):
                    if variant.set(lib, kernel) != kernel:
                        raise SystemExit(f"this machine cannot run {name} {kernel}")
                    t0 = time.perf_counter()
                    out = decoder.generate(prompt, max_new_tokens=128, temperature=0)
                    totals[kernel][0] += len(out.token_ids)
                    totals[kernel][1] += time.perf_counter() - t0
        a, b = (totals[k][0] / totals[k][1] for k in (first, second))
        print(f"{method}: {first} {a:.1f} tok/s, {second} {b:.1f} tok/s, {second}/{first} {b / a:.3f}", flush=True)
    variant.set(lib, build.kernels_in_use()[name])


if __name__ == "__main__":
    main()
