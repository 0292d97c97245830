"""Where a speculative step's time goes, per tree size: drafting (head passes and tree growth),
the target's verification pass, and the rest (verification, rollback, text), from the engine's
own StepRecords, next to plain decoding's step. Fixed tree sizes, the bench's prompts, greedy
(or sampled: --temperature).

    OMP_NUM_THREADS=2 python scripts/step_costs.py --target smollm2 --method eagle --dtype bfloat16
    OMP_NUM_THREADS=2 python scripts/step_costs.py --target smollm2 --method eagle --dtype bfloat16 --no-exact
    OMP_NUM_THREADS=2 python scripts/step_costs.py --target smollm2 --method eagle --dtype bfloat16 --compile
"""
from __future__ import annotations

import argparse
import json

import torch

import specdec
from specdec.chat.template import ChatTemplate
from specdec.data.prompts import build_suite, render_chat


def measure(decoder, prompts: list[str], tokens: int, temperature: float = 0.0) -> dict:
    steps = []
    for i, prompt in enumerate(prompts):
        sampling = {"temperature": temperature, "seed": i} if temperature > 0 else {"temperature": 0}
        for chunk in decoder.stream(prompt, max_new_tokens=tokens, ignore_eos=True, **sampling):
            if chunk.step is not None:
                steps.append(chunk.step)
    n = len(steps)
    made = sum(len(s.new_tokens) for s in steps)
    out = {"steps": n, "tokens_per_step": round(made / n, 3)}
    for part in ("draft_seconds", "sync_seconds", "target_seconds", "other_seconds"):
        out[part.replace("_seconds", "_ms")] = round(1000 * sum(getattr(s, part) for s in steps) / n, 2)
    total = sum(s.draft_seconds + s.sync_seconds + s.target_seconds + s.other_seconds for s in steps)
    out["step_ms"] = round(1000 * total / n, 2)
    out["tokens_per_s"] = round(made / total, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None)
    ap.add_argument("--method", default="eagle")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--sizes", default="0,4,8,16,32", help="tree nodes (0: plain decoding)")
    ap.add_argument("--tasks", default="code,chat")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--no-exact", action="store_true")
    ap.add_argument("--compile", action="store_true", help="the target's passes compiled (implies --no-exact)")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled, prompt i with seed i")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    exact = False if args.no_exact or args.compile else None
    suite = build_suite(args.prompts, args.tasks.split(","))
    rows = []
    plain = specdec.load(target=args.target, dtype=args.dtype, exact=exact, compile=args.compile)
    prompts = [p.text for p in render_chat(suite, ChatTemplate.from_tokenizer_config(plain.tokenizer.config))]
    for size in (int(s) for s in args.sizes.split(",")):
        decoder = plain if size == 0 else specdec.load(target=args.target, method=args.method, draft=args.draft,
                                                       dtype=args.dtype, exact=exact, draft_tokens=size,
                                                       compile=args.compile)
        row = {"nodes": size, **measure(decoder, prompts, args.tokens, args.temperature)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
