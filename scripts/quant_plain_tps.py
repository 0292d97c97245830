"""Plain decoding tok/s of one target in bfloat16 and quantized (--quantize int8 / int4 on the
grouped kernels, and on PyTorch's weight-only kernels, as --compile loads them), all in one
process, prompts interleaved (decode time only: wall minus prefill; held-out code prompts).

    python scripts/quant_plain_tps.py smollm2 3
"""
import os
import sys

import torch

import specdec
import specdec.engine.loading as loading
from specdec.data.prompts import build_suite


def main() -> None:
    os.environ["SPECDEC_CONTROLLER_MEMORY"] = "off"
    target = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.set_num_threads(2)
    prompts = [p.text for p in build_suite(count, ["code"])]
    decoders = {"bf16": specdec.load(target=target, dtype="bfloat16")}
    for mode in ("int8", "int4"):
        decoders[mode] = specdec.load(target=target, dtype="bfloat16", quantize=mode)
    grouped = loading.group_quantizable
    loading.group_quantizable = lambda *args: "PyTorch's kernels asked for"
    try:
        for mode in ("int8", "int4"):
            decoders[f"{mode}-torch"] = specdec.load(target=target, dtype="bfloat16", quantize=mode)
    finally:
        loading.group_quantizable = grouped
    seconds = dict.fromkeys(decoders, 0.0)
    tokens = dict.fromkeys(decoders, 0)
    for round_ in range(2):
        for i, prompt in enumerate(prompts):
            names = list(decoders) if (i + round_) % 2 == 0 else list(reversed(decoders))
            for name in names:
                result = decoders[name].generate(prompt, max_new_tokens=128, ignore_eos=True)
                seconds[name] += result.stats.wall_seconds - result.stats.prefill_seconds
                tokens[name] += len(result.token_ids)
    base = tokens["bf16"] / seconds["bf16"]
    print(" ".join(f"{name} {tokens[name] / seconds[name]:.1f} tok/s ({tokens[name] / seconds[name] / base:.2f}x)"
                   for name in decoders))


if __name__ == "__main__":
    main()
