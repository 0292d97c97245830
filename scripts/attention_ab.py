"""Whole-pass cost of each attention kernel (kernels/variants.py "attention": "avx2", "avx512"),
alternated in one process over the same runner: ms per pass of 1 / 4 / 8 new tokens after
`cached` tokens, medians over rounds. A score's bits differ between the kernels, so this A/B is
the only place both run in one process (a real process keeps the one chosen at load).

    python scripts/attention_ab.py smollm2 default 4 200,1000,2000
    python scripts/attention_ab.py qwen-coder gguf 3 200,1000
    python scripts/attention_ab.py micro 9   # one layer's attention alone, SmolLM2's and Qwen2.5-Coder's heads
    python scripts/attention_ab.py prefill qwen-coder gguf 2048 2   # a prompt's prefill, ms
"""
import statistics
import sys
import time

import torch

from specdec.bench.pass_costs import median_pass_ms
from specdec.engine.loading import load_runner
from specdec.kernels import build
from specdec.models.checkpoint import open_model

WIDTHS = (1, 4, 8)
KERNELS = ("avx2", "avx512")


def library():
    """The kernels, where both attention kernels run here (else the comparison would be avx2 twice)."""
    lib = build.load()
    if lib is None or lib.set_attention_kernel(1) != 1:
        raise SystemExit("the AVX-512 attention kernel cannot run here")
    return lib


def runner_for(target: str, variant: str):
    return load_runner(open_model(target).path, "bfloat16", quantize=None if variant == "default" else variant)


def micro(rounds: int) -> None:
    """ms of one attention call (bf16 cache, T rows of one sequence after L keys), per kernel."""
    from specdec.kernels import invariant

    lib = library()
    g = torch.Generator().manual_seed(0)
    cases = []
    for hd, nh, nkv, L, T in [(64, 9, 3, 1000, 1), (64, 9, 3, 1000, 8), (64, 9, 3, 2000, 8),
                              (128, 12, 2, 1000, 1), (128, 12, 2, 1000, 4), (128, 12, 2, 1000, 8)]:
        q = torch.randn(1, nh, T, hd, generator=g).bfloat16()
        k, v = (torch.randn(1, nkv, L, hd, generator=g).bfloat16() for _ in range(2))
        cases.append((f"hd {hd} heads {nh}/{nkv} L {L} T {T}", q, k, v, list(range(L - T + 1, L + 1))))
    ms: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for name, q, k, v, counts in cases:
            for kernel in range(len(KERNELS)):
                lib.set_attention_kernel(kernel)
                for _ in range(3):
                    invariant.attend(q, k, v, counts)
                start = time.perf_counter()
                for _ in range(30):
                    invariant.attend(q, k, v, counts)
                ms.setdefault((name, kernel), []).append((time.perf_counter() - start) / 30 * 1e3)
    for name, *_ in cases:
        a, b = (statistics.median(ms[(name, kernel)]) for kernel in range(len(KERNELS)))
        print(f"{name:32s} avx2 {a:.3f} ms  avx512 {b:.3f} ms  ({a / b:.2f}x)", flush=True)


def prefill(target: str, variant: str, tokens: int, rounds: int) -> None:
    """ms to prefill a `tokens`-token prompt (the runner's chunks), per kernel, medians over rounds."""
    lib, runner = library(), runner_for(target, variant)
    ids = [100 + (i * 7919) % 20000 for i in range(tokens)]
    ms: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(rounds):
        for kernel in ms:
            lib.set_attention_kernel(kernel)
            runner.reset()
            start = time.perf_counter()
            runner.extend(ids)
            ms[kernel].append((time.perf_counter() - start) * 1e3)
    a, b = statistics.median(ms[0]), statistics.median(ms[1])
    print(f"{target} prefill of {tokens} tokens: avx2 {a:.0f} ms, avx512 {b:.0f} ms ({a / b:.2f}x; "
          f"{tokens / b * 1e3:.0f} tokens/s)")


def main() -> None:
    if sys.argv[1] == "prefill":
        torch.set_num_threads(2)
        return prefill(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    if sys.argv[1] == "micro":
        torch.set_num_threads(2)
        return micro(int(sys.argv[2]))
    target, variant, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    contexts = [int(c) for c in sys.argv[4].split(",")]
    torch.set_num_threads(2)
    lib, runner = library(), runner_for(target, variant)
    ms: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for kernel in range(len(KERNELS)):
            lib.set_attention_kernel(kernel)
            for cached in contexts:
                for width in WIDTHS:
                    ms.setdefault((kernel, cached, width), []).append(median_pass_ms(runner, width, 5, cached=cached))
    for cached in contexts:
        parts = []
        for kernel, name in enumerate(KERNELS):
            m = {w: statistics.median(ms[(kernel, cached, w)]) for w in WIDTHS}
            parts.append(f"{name}: " + " ".join(f"T{w} {m[w]:.2f}" for w in WIDTHS)
                         + f" (4: {m[4] / m[1]:.2f}x 8: {m[8] / m[1]:.2f}x)")
        print(f"cached {cached}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
