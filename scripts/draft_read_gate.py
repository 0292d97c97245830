"""Streamed greedy answers of at most N tokens from the Qwen pair on the bench suite's held-out
code and fim prompts, in one process: plain decoding, `draft` as shipped (its prompt read only
where the tokens left repay it, never before the first token), and `draft` with that gate off
(the read's rate unknown, as before stop 62). Three decoders, so that no variant finds the
prompt another just read (prefix reuse off as well); variants take turns per prompt, the whole
round twice. JSON lines, then the seconds summed per task and variant.

    python scripts/draft_read_gate.py [max_new_tokens]
"""
import json
import sys
import time

import torch

from specdec.data.prompts import build_suite, render_fim
from specdec.engine.decoder import load


def main() -> None:
    torch.set_num_threads(2)
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    decoders = {"plain": load("qwen-coder", method="none", dtype="bfloat16", reuse_prefix=False),
                "gate": load("qwen-coder", method="draft", dtype="bfloat16", reuse_prefix=False),
                "no gate": load("qwen-coder", method="draft", dtype="bfloat16", reuse_prefix=False)}
    ungated = decoders["no gate"].engine.proposer
    prompts = render_fim(build_suite(3, ["code", "fim"]), decoders["gate"].engine.tokenizer)
    for decoder in decoders.values():
        decoder.generate("def f(x):", max_new_tokens=4, temperature=0)
    sums: dict[tuple[str, str], list[float]] = {}
    for round_ in range(2):
        for p in prompts:
            for variant, decoder in decoders.items():
                ungated.read_seconds_per_token = None  # each catch-up times it again
                t0, first = time.perf_counter(), None
                for chunk in decoder.stream(p.text, max_new_tokens=tokens, temperature=0):
                    if first is None and chunk.text:
                        first = time.perf_counter() - t0
                total = time.perf_counter() - t0
                first = total if first is None else first
                cell = sums.setdefault((p.task, variant), [0.0, 0.0])
                cell[0], cell[1] = cell[0] + first, cell[1] + total
                print(json.dumps({"round": round_, "task": p.task, "variant": variant, "first_chunk_s": round(first, 3),
                                  "total_s": round(total, 3)}), flush=True)
    print(f"at most {tokens} tokens, 2 rounds summed: seconds to the first chunk / to the end")
    for (task, variant), (first, total) in sums.items():
        print(f"{task:5s} {variant:8s} first {first:6.2f}  total {total:6.2f}  "
              f"({sums[task, 'plain'][1] / total:.2f}x plain)")


if __name__ == "__main__":
    main()
