"""No cross-talk in continuous batching (issue #16): 32 greedy requests with mixed prompts,
max tokens, methods and stop strings run as one batched job (at most --max-batch at a time, so
requests join as others finish), and each must equal the same request run alone, token for
token, with the same text and finish reason. A third of the requests get a stop string taken
from the middle of their own single-run output, so the stop rule fires mid-generation.

    python scripts/batch_crosstalk.py [--target smollm2] [--method draft|medusa|eagle] [--draft DIR]
                                      [--dtype float32] [--out FILE]

Methods: none and ngram, and --method (draft: a draft with the target's tokenizer, --draft DIR
or the target's shipped one; medusa, eagle: a head folder, --draft DIR or the shipped one).
"""
from __future__ import annotations

import argparse
import sys
import time

import specdec
from specdec.data.prompts import build_suite


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--method", default=None, choices=["draft", "medusa", "eagle"])
    p.add_argument("--draft", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--out", default=None, help="also write the report here")
    args = p.parse_args()

    method = args.method or ("draft" if args.draft else None)
    methods = ["none", "ngram"] + ([method] if method else [])
    decoders = {m: specdec.load(target=args.target, draft=args.draft if m == method else None,
                                method=m, dtype=args.dtype, calibrate=False) for m in methods}
    prompts = [q.text for q in build_suite(8, ["code", "edit", "freetext"])]
    requests = []
    for i in range(args.requests):
        prompt = prompts[i % len(prompts)]
        sampling = {"max_new_tokens": 8 + (i * 7) % 57, "method": methods[i % len(methods)], "temperature": 0}
        requests.append((prompt, sampling))

    def alone(prompt: str, sampling: dict):
        s = dict(sampling)
        return decoders[s.pop("method")].generate(prompt, **s)

    t0 = time.perf_counter()
    for i, (prompt, sampling) in enumerate(requests):
        if i % 3 == 0:
            text = alone(prompt, sampling).text
            if len(text) >= 4:
                sampling["stop"] = [text[len(text) // 2:len(text) // 2 + 2]]
    want = [alone(prompt, sampling) for prompt, sampling in requests]
    t1 = time.perf_counter()
    got = decoders[methods[-1]].generate_batch([r[0] for r in requests], [r[1] for r in requests],
                                               max_batch=args.max_batch)
    t2 = time.perf_counter()

    equal = [(g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
             for g, w in zip(got, want)]
    stopped = sum(w.finish_reason == "stop" and "stop" in s for w, (_, s) in zip(want, requests))
    lines = [f"{args.target} {args.dtype}: {len(requests)} greedy requests, methods {', '.join(methods)}, "
             f"max tokens 8-64, {sum('stop' in s for _, s in requests)} with a stop string, "
             f"--max-batch {args.max_batch}",
             f"finish reasons alone: {sorted({w.finish_reason for w in want})}; "
             f"stopped by their stop string: {stopped}",
             f"drafted / accepted in the batch: {sum(g.stats.drafted_tokens for g in got)} / "
             f"{sum(g.stats.accepted_tokens for g in got)}",
             f"alone {t1 - t0:.1f} s (with the stop-string runs), batched {t2 - t1:.1f} s",
             f"batched equal to alone: {sum(equal)}/{len(equal)}"]
    for i, ok in enumerate(equal):
        if not ok:
            lines.append(f"  request {i} ({requests[i][1]}) differs: batch {got[i].token_ids[:12]}... "
                         f"alone {want[i].token_ids[:12]}...")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0 if all(equal) else 1


if __name__ == "__main__":
    sys.exit(main())
