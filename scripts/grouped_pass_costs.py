"""ms per pass of a GGUF model on its own blocks (`--quantize gguf`), after 200 cached tokens,
exact mode, at widths 1..16; the grouped kernel as this machine chose it or as forced:

    SPECDEC_GROUPED_KERNEL=vnni python scripts/grouped_pass_costs.py qwen-coder
    SPECDEC_GROUPED_KERNEL=avx2 python scripts/grouped_pass_costs.py qwen-coder-draft
"""
import sys

import torch

from specdec.bench.pass_costs import median_pass_ms
from specdec.engine.loading import load_runner
from specdec.kernels.build import kernels_in_use
from specdec.models.checkpoint import open_model

WIDTHS = (1, 2, 4, 8, 16)


def main() -> None:
    torch.set_num_threads(2)
    name = sys.argv[1]
    runner = load_runner(open_model(name).path, "bfloat16", quantize="gguf")
    for width in WIDTHS:
        median_pass_ms(runner, width, 2, True)  # warm-up
    costs = " ".join(f"T={w}: {median_pass_ms(runner, w, 7, True):.1f}" for w in WIDTHS)
    print(f"{kernels_in_use().get('grouped')} {name} {costs}", flush=True)


if __name__ == "__main__":
    main()
