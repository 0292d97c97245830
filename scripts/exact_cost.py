"""Greedy tokens/s with exact (batch-invariant) vs fast kernels, bfloat16, methods taking turns
prompt by prompt.

    python scripts/exact_cost.py smollm2 none,ngram 3 128
    python scripts/exact_cost.py "" none,draft,ngram,medusa,eagle 3 128    # "": the bundled pair
"""
import sys

import specdec
from specdec.data.prompts import build_suite


def main() -> None:
    target = sys.argv[1] or None
    methods = sys.argv[2].split(",")
    n, tokens = int(sys.argv[3]), int(sys.argv[4])
    prompts = [p.text[-600:] for p in build_suite(4) if p.task == "code"][:n]
    decoders = {(m, exact): specdec.load(target=target, method=m, dtype="bfloat16", exact=exact)
                for m in methods for exact in (False, True)}
    totals = {key: [0, 0.0] for key in decoders}
    for prompt in prompts:
        for key, decoder in decoders.items():
            stats = decoder.generate(prompt, max_new_tokens=tokens, ignore_eos=True).stats
            totals[key][0] += stats.new_tokens
            totals[key][1] += stats.wall_seconds
    for m in methods:
        fast, exact = (totals[m, e][0] / totals[m, e][1] for e in (False, True))
        print(f"{target or 'pycode-target'} {m}: fast {fast:.1f} tok/s, exact {exact:.1f} tok/s, "
              f"exact/fast {exact / fast:.2f}", flush=True)


if __name__ == "__main__":
    main()
