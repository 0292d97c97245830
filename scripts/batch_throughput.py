"""Aggregate tokens/s of offline batched generation (SpecDecoder.generate_batch) against the
same prompts one at a time, per batch size and method, greedy, ignore_eos (every prompt makes
max_new_tokens). Prompts: the held-out code and chat suite.

    python scripts/batch_throughput.py smollm2 bfloat16 16 64 1,4,16 none,ngram [int8|int4|-] [exact|fast]
"""
import sys
import time

import specdec
from specdec.chat.template import ChatTemplate
from specdec.data.prompts import build_suite, render_chat


def main() -> None:
    target, dtype = sys.argv[1], sys.argv[2]
    count, tokens = int(sys.argv[3]), int(sys.argv[4])
    sizes = [int(x) for x in sys.argv[5].split(",")]
    methods = sys.argv[6].split(",")
    quantize = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] != "-" else None
    exact = {"exact": True, "fast": False}[sys.argv[8]] if len(sys.argv) > 8 else None
    for method in methods:
        decoder = specdec.load(target, method=method, dtype=dtype, max_len=1024, quantize=quantize,
                               exact=exact)
        template = ChatTemplate.from_tokenizer_config(decoder.tokenizer.config)
        prompts = [p.text for p in render_chat(build_suite(count, ["code", "chat"]), template)][:count]
        decoder.generate_batch(prompts[:2], max_batch=2, max_new_tokens=4)  # warm-up
        for size in sizes:
            t0 = time.perf_counter()
            if size == 1:  # the single-sequence engine, as generate() runs it
                results = [decoder.generate(p, max_new_tokens=tokens, ignore_eos=True) for p in prompts]
            else:
                results = decoder.generate_batch(prompts, max_batch=size, max_new_tokens=tokens, ignore_eos=True)
            seconds = time.perf_counter() - t0
            new = sum(len(r.token_ids) for r in results)
            kernels = "exact" if decoder.exact else "fast"
            print(f"{target} {dtype} {quantize or ''} {kernels} {method:6s} batch {size:2d}: "
                  f"{new / seconds:7.1f} tok/s "
                  f"aggregate ({len(prompts)} prompts x {tokens} tokens, {seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
