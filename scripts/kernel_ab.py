"""ms per target pass over T tokens with each bf16 product kernel this CPU can run (rows.cpp:
avx2, amx, avx512), switched in one process and interleaved over rounds, so that a VM's drift
between processes does not decide the comparison. bf16 weights are read where they lie, so
switching kernels needs no new layout. Also the streaming bound of one pass: the read bandwidth
measured each round, and each round's 1-token pass set against it. Extra
names after the rounds (int8, int4: `--quantize` on the grouped kernels) add those runners to the
same rounds, on the bf16 kernel this machine chose.

    python scripts/kernel_ab.py smollm2 [threads] [rounds] [int8,int4]
"""
import statistics
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
    quantized = sys.argv[4].split(",") if len(sys.argv) > 4 else []
    lib, bf16 = build.load(), variants.VARIANTS[0]
    chosen = build.kernels_in_use()["bf16"]
    kernels = [k for k in bf16.runnable(build.cpu_flags()) if bf16.set(lib, k) == k]
    bf16.set(lib, chosen)
    path = open_model(target).path
    runner = load_runner(path, "bfloat16")
    # (name, runner, bf16 kernel): each bf16 kernel on the bf16 runner, then the quantized runners
    rows = [(k, runner, k) for k in kernels]
    rows += [(q, load_runner(path, "bfloat16", quantize=q), chosen) for q in quantized]
    ms = {name: {w: [] for w in WIDTHS} for name, _, _ in rows}
    # the read bandwidth moved 46-82 GB/s between runs on one VM: measured each round, beside the
    # passes, and each runner's 1-token pass set against its own round's bound
    bandwidths = []
    for _ in range(rounds):
        bandwidths.append(streaming_bandwidth())
        for name, run, kernel in rows:
            bf16.set(lib, kernel)
            for width in WIDTHS:
                median_pass_ms(run, width, 2, True)  # warm-up
                ms[name][width].append(median_pass_ms(run, width, 11, True))
    print(f"{build.cpu_model()}, {torch.get_num_threads()} threads; streaming "
          f"{' / '.join(f'{b / 1e9:.1f}' for b in bandwidths)} GB/s by round")
    for name, run, _ in rows:
        nbytes = weight_bytes_per_pass(run)
        shares = sorted(nbytes / b / (t * 1e-3) for b, t in zip(bandwidths, ms[name][1]))
        best = {w: min(v) for w, v in ms[name].items()}
        cells = " ".join(f"T={w}: {best[w]:.2f}" for w in WIDTHS)
        ratios = " ".join(f"{w}: {best[w] / best[1]:.2f}x" for w in (4, 8))
        # each round's widths ran back to back: their ratio within a round drifts less than the best of
        # each width over rounds, which one fast round (the probe once read 82 GB/s against ~49) skews
        per_round = " ".join(f"{w}: {statistics.median(t / o for t, o in zip(ms[name][w], ms[name][1])):.2f}x"
                             for w in (4, 8))
        print(f"{name:7s} ms a pass (best of {rounds} rounds)  {cells}  | {ratios} "
              f"(median of rounds' {per_round}) | T=1 at "
              f"{statistics.median(shares):.0%} of its round's bound (median; {shares[0]:.0%}-{shares[-1]:.0%})",
              flush=True)

if __name__ == "__main__":
    main()
