"""Aggregate tokens/s of the batched engine per method, in process: N requests (held-out code
prompts, T=0, a fixed number of tokens, EOS ignored) through a Scheduler of N slots, for each
N and method; methods take turns (in an order that turns each repeat), the whole round repeated
(the repeats summed are reported).
It approximates N closed-loop clients of `specdec serve --max-batch N` without HTTP: each client
sends --requests-per-client requests one after another (a request waits for a free slot). With
one request a client, a round is one wave of N requests that lasts as long as its slowest one:
drafting that speeds up some sequences and not others gains nothing there, while closed-loop
clients fill a freed slot with their next request.

    python scripts/batch_methods_tps.py [--target smollm2] [--dtype bfloat16] [--methods none,eagle,draft]
                                        [--clients 1,16] [--tokens 64] [--repeats 2]
                                        [--requests-per-client 1]
"""
from __future__ import annotations

import argparse
import time

import torch

import specdec
from specdec.data.prompts import build_suite
from specdec.engine.requests import generate_all
from specdec.engine.scheduler import Scheduler
from specdec.sampling import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--methods", default="none,eagle,draft")
    p.add_argument("--clients", default="1,16")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests-per-client", type=int, default=1)
    args = p.parse_args()
    methods, sizes = args.methods.split(","), [int(x) for x in args.clients.split(",")]
    torch.set_num_threads(args.threads)
    decoders = {m: specdec.load(target=args.target, method=m, dtype=args.dtype, calibrate=True) for m in methods}
    # distinct prompts for every request of a round (92 held-out code prompts at most)
    prompts = list(dict.fromkeys(q.text for q in build_suite(max(16, max(sizes) * args.requests_per_client), ["code"])))
    engines: dict[tuple[str, int], Scheduler] = {}
    totals: dict[tuple[str, int], list[float]] = {}  # tokens, seconds over the repeats
    for r in range(args.repeats):
        for n in sizes:
            # the methods' order turns each repeat: a VM that slows within a round would otherwise
            # favour whichever method always ran first
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                if (m, n) not in engines:
                    engines[m, n] = Scheduler(decoders[m].engine, max_batch=n, calibrate=True)
                params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
                t0 = time.perf_counter()
                # each repeat other prompts in each slot: a prompt met again would find its rows
                # left by the last request (prefix reuse), which plain decoding has and a tree
                # drafter (whose head needs the prompt's features) does not
                results = generate_all(engines[m, n], [(prompts[(i + r) % len(prompts)], params, m)
                                                       for i in range(n * args.requests_per_client)])
                seconds = time.perf_counter() - t0
                tps = sum(len(x.token_ids) for x in results) / seconds
                accepted = sum(x.stats.accepted_tokens for x in results) / sum(x.stats.target_forwards for x in results)
                total = totals.setdefault((m, n), [0.0, 0.0])
                total[0] += sum(len(x.token_ids) for x in results)
                total[1] += seconds
                print(f"repeat {r} clients {n:2d} {m:6s} {tps:6.1f} tok/s  accepted a step {accepted:.2f}", flush=True)
    # all repeats summed: each repeat runs other prompts, so the best repeat of a method would
    # also pick its easiest prompts
    print(f"{args.target} {args.dtype}, {args.tokens} tokens a request, {args.requests_per_client} request(s) "
          f"a client, {args.repeats} repeats summed:")
    for n in sizes:
        base = totals["none", n][0] / totals["none", n][1] if ("none", n) in totals else None
        for m in methods:
            tps = totals[m, n][0] / totals[m, n][1]
            print(f"clients {n:2d} {m:6s} {tps:6.1f} tok/s" + (f"  {tps / base:.2f}x none" if base else ""))

if __name__ == "__main__":
    main()
