"""Load time, time to the first token and peak resident memory for the Qwen2.5-Coder pair, one
fresh process per method (JSON lines): the bench suite's held-out code and fim prompts, bfloat16,
2 threads; `llama.cpp` times llama-server's prompt on the same token ids.

    python scripts/ttft_load_memory.py none
    python scripts/ttft_load_memory.py draft
    python scripts/ttft_load_memory.py llama.cpp /path/to/llama.cpp/bin
"""
import json
import resource
import sys
import time

import torch

from specdec.data.prompts import build_suite, render_fim
from specdec.engine.decoder import load
from specdec.engine.text import TextTokenizer
from specdec.models.bundled import resolve_model_name

TARGET = "qwen-coder"


def main() -> None:
    torch.set_num_threads(2)
    method = sys.argv[1]
    if method == "llama.cpp":
        from specdec.bench.llama_cpp import LlamaServer

        tokenizer = TextTokenizer(resolve_model_name(TARGET))
        prompts = render_fim(build_suite(3, ["code", "fim"]), tokenizer)
        start = time.perf_counter()
        with LlamaServer(sys.argv[2] + "/llama-server", resolve_model_name(TARGET), 2) as server:
            load_s = time.perf_counter() - start
            server.complete(tokenizer.encode("def f(x):"), 1)  # warm-up
            for p in prompts:
                ids = tokenizer.encode(p.text)
                c = server.complete(ids, 1)
                print(json.dumps({"method": method, "task": p.task, "prompt_tokens": len(ids),
                                  "ttft_s": round(c.seconds, 3), "load_s": round(load_s, 1)}))
            print(json.dumps({"method": method, "peak_rss_mb": (server.peak_rss_bytes() or 0) // 2**20}))
        return
    start = time.perf_counter()
    decoder = load(TARGET, method=method, dtype="bfloat16")
    load_s = time.perf_counter() - start
    prompts = render_fim(build_suite(3, ["code", "fim"]), decoder.engine.tokenizer)
    decoder.generate("def f(x):", max_new_tokens=2, temperature=0)  # warm-up
    for p in prompts:
        start = time.perf_counter()
        out = decoder.generate(p.text, max_new_tokens=1, temperature=0)
        print(json.dumps({"method": method, "task": p.task, "prompt_tokens": out.prompt_tokens,
                          "ttft_s": round(time.perf_counter() - start, 3)}))
    print(json.dumps({"method": method, "load_s": round(load_s, 1),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


if __name__ == "__main__":
    main()
