"""SmolLM2 under `--quantize int4` or `int8`, whole passes after 200 cached tokens, its one-level
grouped weights (int4 where K is not a multiple of 128; int8: Q8_0's) row-major (rows.cpp qtile)
against the columns layout (avx2_group_glinear, avx2_signed_glinear on AVX2; vnni_glinear where the
machine chose VNNI), two runners in one process, passes alternating: medians, and the median of the
columns/row-major ratio of each pair (the VM's swings fall on both alike). Every other weight (the
K-quant-shaped down projections of int4) is laid out as this machine's kernels read it in both.

    python scripts/grouped_layout_ab.py [widths] [rounds] [int4|int8]
    python scripts/grouped_layout_ab.py 1,2,3,4,5,8,16 15 int4
"""
import statistics
import sys
import time

import torch

import specdec.models.grouped as grouped_module
from specdec.engine.loading import load_runner
from specdec.models.checkpoint import open_model


def main() -> None:
    widths = [int(w) for w in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2, 3, 4, 8, 16]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    mode = sys.argv[3] if len(sys.argv) > 3 else "int4"
    torch.set_num_threads(2)
    path = open_model("smollm2").path
    columns = load_runner(path, "bfloat16", quantize=mode)
    laid = grouped_module.for_kernels
    grouped_module.for_kernels = lambda g: g if (g.four_bit_one_level or g.signed_bytes) else laid(g)
    try:
        row_major = load_runner(path, "bfloat16", quantize=mode)
    finally:
        grouped_module.for_kernels = laid
    prompt = list(range(100, 300))
    for runner in (row_major, columns):
        runner.reset()
        runner.extend(prompt)

    def seconds(runner, width: int) -> float:
        t0 = time.perf_counter()
        runner.extend(list(range(7, 7 + width)))
        elapsed = time.perf_counter() - t0
        runner.rollback(len(prompt))
        return elapsed

    for width in widths:  # warm-up: each shape's first call
        seconds(row_major, width), seconds(columns, width)
    times = {w: ([], []) for w in widths}
    for _ in range(rounds):
        for w in widths:
            times[w][0].append(seconds(row_major, w))
            times[w][1].append(seconds(columns, w))
    one = [statistics.median(t) for t in times[widths[0]]]
    print(f"smollm2 --quantize {mode}, bfloat16, 2 threads, {rounds} pairs a width")
    for w in widths:
        a, b = (statistics.median(t) for t in times[w])
        ratio = statistics.median([y / x for x, y in zip(*times[w])])
        print(f"T{w:<3d} row-major {a * 1e3:7.2f} ms ({a / one[0]:.2f}x T{widths[0]})  columns {b * 1e3:7.2f} ms "
              f"({b / one[1]:.2f}x T{widths[0]})  columns/row-major {ratio:.3f}")


if __name__ == "__main__":
    main()
