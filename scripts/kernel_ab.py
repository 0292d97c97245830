"""ms per target pass over T tokens with each bf16 product kernel this CPU can run (rows.cpp:
avx2, amx, avx512), switched in one process and interleaved over rounds, so that a VM's drift
between processes does not decide the comparison. bf16 weights are read where they lie, so
switching kernels needs no new layout. Also prints the streaming bound of one pass.

    python scripts/kernel_ab.py smollm2 [threads] [rounds]
"""
import sys

import torch

from specdec.bench.pass_costs import WIDTHS, median_pass_ms, streaming_bandwidth, weight_bytes_per_pass
from specdec.engine.loading import load_runner
from specdec.kernels import build, variants
from specdec.models.checkpoint import open_model


def main() -> None:
    target = sys.argv[1]
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    lib, bf16 = build.load(), variants.VARIANTS[0]
    kernels = [k for k in bf16.runnable(build.cpu_flags()) if bf16.set(lib, k) == k]
    runner = load_runner(open_model(target).path, "bfloat16")
    ms = {k: {w: [] for w in WIDTHS} for k in kernels}
    for _ in range(rounds):
        for kernel in kernels:
            bf16.set(lib, kernel)
            for width in WIDTHS:
                median_pass_ms(runner, width, 2, True)  # warm-up
                ms[kernel][width].append(median_pass_ms(runner, width, 11, True))
    bound = weight_bytes_per_pass(runner) / streaming_bandwidth() * 1e3
    print(f"{build.cpu_model()}, {torch.get_num_threads()} threads; streaming bound of a pass {bound:.2f} ms")
    for kernel in kernels:
        best = {w: min(v) for w, v in ms[kernel].items()}
        cells = " ".join(f"T={w}: {best[w]:.2f}" for w in WIDTHS)
        ratios = " ".join(f"{w}: {best[w] / best[1]:.2f}x" for w in (4, 8))
        print(f"{kernel:7s} ms a pass (best of {rounds} rounds)  {cells}  | {ratios} | T=1 at "
              f"{bound / best[1]:.0%} of the bound", flush=True)


if __name__ == "__main__":
    main()
