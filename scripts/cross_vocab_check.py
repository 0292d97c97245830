"""Cross-vocabulary drafting on a real pair (default: SmolLM2 target, bundled pycode-draft):
greedy identity with plain decoding and acceptance of both variants (string-level and
token-level intersection) at T=0, on held-out code prompts, fixed K so the variants are
compared on the same number of drafts.

    OMP_NUM_THREADS=2 python scripts/cross_vocab_check.py --prompts 20 --tokens 64 --dtype float32

Prints one line per variant and a JSON summary; exits 1 if any output differs from plain decoding."""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import specdec
from specdec.data.prompts import build_suite


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2")
    p.add_argument("--draft", default="specdec/bundled_models/pycode-draft")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--tasks", default="code", help="comma-separated prompt tasks (specdec.data.prompts)")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = args.tasks.split(",")
    prompts = [x.text for x in build_suite(-(-args.prompts // len(tasks)), tasks)][:args.prompts]
    plain = specdec.load(target=args.target, method="none", dtype=args.dtype)
    want = [plain.generate(x, temperature=0, max_new_tokens=args.tokens, ignore_eos=True).token_ids for x in prompts]
    summary, ok = {}, True
    for mode in ("string", "tli"):
        spec = specdec.load(target=args.target, draft=args.draft, method="draft", dtype=args.dtype,
                            draft_tokens=args.draft_tokens, cross_vocab=mode)
        same = drafted = accepted = steps = 0
        t0 = time.perf_counter()
        for prompt, tokens in zip(prompts, want):
            result = spec.generate(prompt, temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
            same += result.token_ids == tokens
            drafted += result.stats.drafted_tokens
            accepted += result.stats.accepted_tokens
            steps += result.stats.target_forwards
        seconds = time.perf_counter() - t0
        ok &= same == len(prompts)
        summary[mode] = dict(identical=same, prompts=len(prompts), drafted=drafted, accepted=accepted,
                             acceptance=round(accepted / max(drafted, 1), 3),
                             tokens_per_step=round(len(prompts) * args.tokens / max(steps, 1), 3),
                             seconds=round(seconds, 1))
        print(f"{mode:6s} identical {same}/{len(prompts)}  drafted {drafted}  accepted {accepted} "
              f"({summary[mode]['acceptance']:.0%})  tokens/step {summary[mode]['tokens_per_step']}", flush=True)
    print(json.dumps(dict(summary, target=args.target, draft=args.draft, dtype=args.dtype, tokens=args.tokens,
                          draft_tokens=args.draft_tokens)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
