"""ms per target pass over T tokens (cache prefilled with 200 tokens), with the projections
unfused and fused: the cost curve speculation lives on.

    python scripts/pass_costs.py smollm2 bfloat16 [threads]
"""
import sys
import time

import torch

from specdec.models.checkpoint import load_native, open_model
from specdec.models.runner import NativeRunner

WIDTHS = (1, 4, 16, 32)


def median_ms(runner: NativeRunner, width: int, repeats: int) -> float:
    runner.reset()
    runner.extend(list(range(100, 300)))
    base = runner.length
    times = []
    for _ in range(repeats):
        runner.rollback(base)
        t0 = time.perf_counter()
        runner.extend(list(range(5, 5 + width)))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    target, dtype = sys.argv[1], sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    source = open_model(target)
    for fuse in (False, True):
        runner = NativeRunner(load_native(source, dtype), 1024, fuse=fuse)
        for width in WIDTHS:
            median_ms(runner, width, 3)  # warm-up
        costs = " ".join(f"T={w}: {median_ms(runner, w, 15):.2f} ms" for w in WIDTHS)
        print(f"fuse={fuse} {costs}", flush=True)


if __name__ == "__main__":
    main()
