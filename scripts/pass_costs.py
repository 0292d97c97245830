"""ms per target pass over T tokens (cache prefilled with 200 tokens), for several runtime
variants: "default", "int8-grouped", "int4-grouped", "gguf" (a GGUF's own blocks) as `specdec
generate` loads them (--dtype, --quantize: the one-call stack of batch-invariant kernels where it
applies); projections
unfused, fused, fused + packed for oneDNN (PyTorch's layers), fused + PyTorch's weight-only int8
/ int4, and the layers compiled by inductor ("compiled", "int8-compiled", "int4-compiled": fast
kernels only);
a variant ending in "-exact" runs exact mode's kernels. The 1..32
columns are the cost curve speculation lives on; T=256 is a prefill chunk.

    python scripts/pass_costs.py smollm2 bfloat16 [threads] [variants]
    python scripts/pass_costs.py smollm2 bfloat16 2 default-exact,int8-grouped-exact,int4-grouped-exact
    python scripts/pass_costs.py smollm2 bfloat16 2 fused,packed,fused-exact,packed-exact
    python scripts/pass_costs.py smollm2 bfloat16 2 packed,compiled
    SPECDEC_GROUPED_KERNEL=vnni python scripts/pass_costs.py qwen-coder bfloat16 2 gguf-exact
    python scripts/pass_costs.py smollm2 bfloat16 2 int8,int8-compiled,int4-compiled
"""
import sys

import torch

from specdec.bench.pass_costs import median_pass_ms
from specdec.engine.loading import load_runner
from specdec.models.checkpoint import load_native, open_model
from specdec.models.quant import quantize_model
from specdec.models.runner import NativeRunner

WIDTHS = (1, 2, 4, 8, 16, 32, 256)


def make_runner(source, dtype: str, variant: str) -> NativeRunner:
    variant = variant.removesuffix("-exact")
    if variant == "gguf":
        return load_runner(source.path, dtype, quantize="gguf")
    if variant in ("default", "int8-grouped", "int4-grouped"):
        return load_runner(source.path, dtype, quantize=None if variant == "default" else variant[:4])
    quantize, compiled = variant.removesuffix("-compiled"), variant.endswith("compiled")
    runner = NativeRunner(load_native(source, dtype), 1024, fuse=variant != "unfused",
                          pack=variant in ("packed", "compiled"), compile=compiled)
    if quantize in ("int8", "int4"):
        quantize_model(runner.model, quantize)
    return runner


def main() -> None:
    target, dtype = sys.argv[1], sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    variants = sys.argv[4].split(",") if len(sys.argv) > 4 else ["unfused", "fused", "packed", "int8", "int4"]
    source = open_model(target)
    for variant in variants:
        runner = make_runner(source, dtype, variant)
        exact = variant.endswith("-exact")
        for width in WIDTHS:
            median_pass_ms(runner, width, 2, exact)  # warm-up
        costs = " ".join(f"T={w}: {median_pass_ms(runner, w, 5 if w > 32 else 15, exact):.2f}" for w in WIDTHS)
        print(f"{variant:18s} ms per pass  {costs}", flush=True)


if __name__ == "__main__":
    main()
