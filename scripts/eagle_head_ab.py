"""EAGLE with its head's projections in the model dtype against the head rounded to 4 bits
(`--draft-4bit`, the default), and plain decoding, interleaved in one process (each prompt's
methods in turn, the order reversed every other prompt), with each decoder's own fresh controller:
tokens/s with prefill, tokens a step and drafting ms a step, summed over the prompts and repeats.

    python scripts/eagle_head_ab.py [--target smollm2] [--temperatures 0,1] [--prompts 3] [--tokens 128]
                                    [--repeats 2]
"""
from __future__ import annotations

import argparse
import collections

import specdec
from specdec.data.prompts import build_suite


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    prompts = build_suite(args.prompts, ["code"])
    # every run pays for its prompt; fresh controllers (what earlier processes learned for one
    # setup and not the other would decide the comparison)
    common = dict(dtype="bfloat16", reuse_prefix=False, memory=False)
    decoders = {"none": specdec.load(args.target, **common),
                "eagle, dense head": specdec.load(args.target, method="eagle", draft_4bit=False, **common),
                "eagle, 4-bit head": specdec.load(args.target, method="eagle", **common)}
    names = list(decoders)
    for temperature in (float(t) for t in args.temperatures.split(",")):
        totals = {name: collections.Counter() for name in names}
        for repeat in range(args.repeats):
            for i, prompt in enumerate(prompts):
                for name in names if (repeat + i) % 2 == 0 else names[::-1]:
                    s = decoders[name].generate(prompt.text, max_new_tokens=args.tokens, temperature=temperature,
                                                seed=i, seed_mode="rejection", ignore_eos=True).stats
                    c = totals[name]
                    c["tokens"] += s.new_tokens
                    c["seconds"] += s.wall_seconds
                    c["steps"] += s.target_forwards
                    c["draft"] += s.draft_seconds
        plain = totals["none"]["tokens"] / totals["none"]["seconds"]
        for name in names:
            c = totals[name]
            rate = c["tokens"] / c["seconds"]
            drafting = 1e3 * c["draft"] / c["steps"]
            print(f"T={temperature:g}  {name:18s} {rate:7.1f} tok/s  {rate / plain:5.2f}x plain  "
                  f"{c['tokens'] / c['steps']:.2f} tokens a step  drafting {drafting:.2f} ms a step", flush=True)


if __name__ == "__main__":
    main()
