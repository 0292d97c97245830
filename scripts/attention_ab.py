"""Whole-pass cost of each attention kernel (kernels/variants.py "attention": "avx2", "avx512",
"avx512bf16"; those this CPU runs),
alternated in one process over the same runner: ms per pass of 1 / 4 / 8 new tokens after
`cached` tokens, medians over rounds. A score's bits differ between the kernels, so this A/B is
the only place both run in one process (a real process keeps the one chosen at load).

    python scripts/attention_ab.py smollm2 default 4 200,1000,2000
    python scripts/attention_ab.py qwen-coder gguf 3 200,1000
    python scripts/attention_ab.py micro 9   # one layer's attention alone, SmolLM2's and Qwen2.5-Coder's heads
    python scripts/attention_ab.py prefill qwen-coder gguf 2048 2   # a prompt's prefill, ms
    python scripts/attention_ab.py decode qwen-coder none,draft 2 2   # long prompts end to end, greedy
"""
import statistics
import sys
import time

import torch

from specdec.bench.pass_costs import median_pass_ms
from specdec.engine.loading import load_runner
from specdec.kernels import build, variants
from specdec.models.checkpoint import open_model

WIDTHS = (1, 4, 8)
ATTENTION = next(variant for variant in variants.VARIANTS if variant.name == "attention")
KERNELS = ATTENTION.kernels


def library():
    """The kernels, where the AVX-512 attention kernels run here (else the comparison would be avx2
    twice), and the kernels this CPU runs."""
    lib = build.load()
    runnable = ATTENTION.runnable(build.cpu_flags())
    if lib is None or len(runnable) < 2:
        raise SystemExit("the AVX-512 attention kernels cannot run here")
    return lib, [KERNELS.index(k) for k in runnable]


def runner_for(target: str, variant: str):
    return load_runner(open_model(target).path, "bfloat16", quantize=None if variant == "default" else variant)


def micro(rounds: int) -> None:
    """ms of one attention call (bf16 cache, T rows of one sequence after L keys), per kernel."""
    from specdec.kernels import invariant

    lib, kernels = library()
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
            for kernel in kernels:
                lib.set_attention_kernel(kernel)
                for _ in range(3):
                    invariant.attend(q, k, v, counts)
                start = time.perf_counter()
                for _ in range(30):
                    invariant.attend(q, k, v, counts)
                ms.setdefault((name, kernel), []).append((time.perf_counter() - start) / 30 * 1e3)
    for name, *_ in cases:
        m = {kernel: statistics.median(ms[(name, kernel)]) for kernel in kernels}
        print(f"{name:32s} " + "  ".join(f"{KERNELS[k]} {m[k]:.3f} ms ({m[0] / m[k]:.2f}x)" for k in kernels),
              flush=True)


def prefill(target: str, variant: str, tokens: int, rounds: int) -> None:
    """ms to prefill a `tokens`-token prompt (the runner's chunks), per kernel, medians over rounds."""
    (lib, kernels), runner = library(), runner_for(target, variant)
    ids = [100 + (i * 7919) % 20000 for i in range(tokens)]
    ms: dict[int, list[float]] = {kernel: [] for kernel in kernels}
    for _ in range(rounds):
        for kernel in ms:
            lib.set_attention_kernel(kernel)
            runner.reset()
            start = time.perf_counter()
            runner.extend(ids)
            ms[kernel].append((time.perf_counter() - start) * 1e3)
    m = {kernel: statistics.median(ms[kernel]) for kernel in kernels}
    print(f"{target} prefill of {tokens} tokens: " + ", ".join(
        f"{KERNELS[k]} {m[k]:.0f} ms ({m[0] / m[k]:.2f}x; {tokens / m[k] * 1e3:.0f} tokens/s)" for k in kernels))


def decode(target: str, methods: list[str], prompts: int, rounds: int) -> None:
    """Decoding tok/s (128 greedy tokens after the prompt) and prefill seconds on the bench's long
    code prompts, per kernel and method, medians over prompts and rounds (the kernels' order
    alternating by round), and whether each method's tokens equal plain decoding's (by kernel)."""
    import specdec
    from specdec.data.prompts import build_suite

    lib, kernels = library()
    decoders = {m: specdec.load(target, method=m, dtype="bfloat16", memory=False, reuse_prefix=False)
                for m in methods}
    texts = [p.text for p in build_suite(prompts, ["longcode"])[:prompts]]
    runs: dict[tuple, list] = {}
    for r in range(rounds):
        for kernel in kernels if r % 2 == 0 else kernels[::-1]:
            lib.set_attention_kernel(kernel)
            for method, decoder in decoders.items():
                for text in texts:
                    out = decoder.generate(text, max_new_tokens=128, temperature=0, ignore_eos=True)
                    decoding = out.stats.wall_seconds - out.stats.prefill_seconds
                    runs.setdefault((method, kernel), []).append(
                        (out.prompt_tokens, 128 / decoding, out.stats.prefill_seconds, out.token_ids))
    for method in methods:
        for kernel in kernels:
            rows = runs[(method, kernel)]
            same = all(a[3] == b[3] for a, b in zip(rows, runs[(methods[0], kernel)]))
            print(f"{method:6s} {KERNELS[kernel]:10s} prompts of {[row[0] for row in rows[:prompts]]} tokens: "
                  f"decoding {statistics.median(row[1] for row in rows):.1f} tok/s, prefill "
                  f"{statistics.median(row[2] for row in rows):.2f} s; tokens = {methods[0]}'s: {same}", flush=True)


def main() -> None:
    if sys.argv[1] == "decode":
        torch.set_num_threads(2)
        return decode(sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5]))
    if sys.argv[1] == "prefill":
        torch.set_num_threads(2)
        return prefill(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    if sys.argv[1] == "micro":
        torch.set_num_threads(2)
        return micro(int(sys.argv[2]))
    target, variant, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    contexts = [int(c) for c in sys.argv[4].split(",")]
    torch.set_num_threads(2)
    (lib, kernels), runner = library(), runner_for(target, variant)
    ms: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for kernel in kernels:
            lib.set_attention_kernel(kernel)
            for cached in contexts:
                for width in WIDTHS:
                    ms.setdefault((kernel, cached, width), []).append(median_pass_ms(runner, width, 5, cached=cached))
    for cached in contexts:
        parts = []
        for kernel in kernels:
            name = KERNELS[kernel]
            m = {w: statistics.median(ms[(kernel, cached, w)]) for w in WIDTHS}
            parts.append(f"{name}: " + " ".join(f"T{w} {m[w]:.2f}" for w in WIDTHS)
                         + f" (4: {m[4] / m[1]:.2f}x 8: {m[8] / m[1]:.2f}x)")
        print(f"cached {cached}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
