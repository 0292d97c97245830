"""Time to the first streamed chunk and to the end of a 32-token answer (greedy) for the Qwen pair,
on the bench suite's held-out code and fim prompts, one fresh process per method (JSON lines). Unlike
scripts/ttft_load_memory.py (one token a request: a drafter never drafts there), this is what a
streaming client sees when the first decode step drafts.

    python scripts/stream_first_chunk.py none
    python scripts/stream_first_chunk.py draft
"""
import json
import sys
import time

import torch

from specdec.data.prompts import build_suite, render_fim
from specdec.engine.decoder import load


def main() -> None:
    torch.set_num_threads(2)
    method = sys.argv[1]
    decoder = load("qwen-coder", method=method, dtype="bfloat16")
    prompts = render_fim(build_suite(3, ["code", "fim"]), decoder.engine.tokenizer)
    decoder.generate("def f(x):", max_new_tokens=4, temperature=0)
    for p in prompts:
        t0 = time.perf_counter()
        first = None
        for chunk in decoder.stream(p.text, max_new_tokens=32, temperature=0):
            if first is None and chunk.text:
                first = time.perf_counter() - t0
        print(json.dumps({"method": method, "task": p.task, "first_chunk_s": round(first, 3),
                          "total_s": round(time.perf_counter() - t0, 3)}))


if __name__ == "__main__":
    main()
