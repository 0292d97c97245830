"""Greedy output of compiled passes (`--compile`: inductor, its C++ GEMM template for 1-token
passes) against the eager reference: METHOD with --compile against eager `none`, 20 held-out
prompts (7 per task, as `specdec verify` uses) x 64 tokens. #14 asks the fast path's greedy
output to equal the eager path's in float32.

    python scripts/compiled_identity.py smollm2 float32 none,ngram
"""
import json
import sys

import torch

import specdec
from specdec.cli.lossless_check import output_identity
from specdec.data.prompts import build_suite


def main() -> None:
    target, dtype, methods = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    torch.set_num_threads(2)
    prompts = [p.text for p in build_suite(7)][:20]
    eager = specdec.load(target=target, method="none", dtype=dtype, memory=False)
    for method in methods:
        compiled = specdec.load(target=target, method=method, dtype=dtype, compile=True, memory=False)
        report = output_identity(compiled, eager, prompts, 64)
        print(json.dumps({"method": f"{method} --compile vs eager none", "dtype": dtype, **report}), flush=True)


if __name__ == "__main__":
    main()
