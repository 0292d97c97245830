"""How close the 8-row grouped products come to this CPU's integer dot-product rate: one core's
VPDPBUSD (and, beside it, VFMADD231PS and VDPBF16PS) rate from 24 independent 512-bit chains (a
small C program built with the kernels' compiler), against the VNNI product of int4 weights that
stay in L2 (no memory in the way) at 1 / 4 / 8 / 16 rows, both threads. A row's work is fixed
(one VPDPBUSD per 64 weight bytes and row), so where the product runs near that rate, more rows
cost proportionally more, whatever the memory: what bounds an 8-token pass's ratio to a 1-token one.

    python scripts/compute_ceiling.py [N K]
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec.kernels import build

CHAINS = 24
PROGRAM = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define KEEP(a) _Pragma("GCC unroll 32") for (int i = 0; i < C; ++i) __asm__ volatile("" : "+v"(a[i]))
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16"))) int main() {
    enum { C = CHAINS_HERE };
    const long n = 100000000 / C;
    __m512i a[C]; __m512 f[C];
    for (int i = 0; i < C; ++i) { a[i] = _mm512_set1_epi32(i); f[i] = _mm512_set1_ps(i); }
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    const __m512 y = _mm512_set1_ps(1.0001f), z = _mm512_set1_ps(0.5f);
    double t = now();
    for (long r = 0; r < n; ++r) {
        _Pragma("GCC unroll 32") for (int i = 0; i < C; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
        KEEP(a);
    }
    printf("VPDPBUSD %.2f\n", n * C / (now() - t) / 1e9);
    t = now();
    for (long r = 0; r < n; ++r) {
        _Pragma("GCC unroll 32") for (int i = 0; i < C; ++i) f[i] = _mm512_fmadd_ps(f[i], y, z);
        KEEP(f);
    }
    printf("VFMADD231PS %.2f\n", n * C / (now() - t) / 1e9);
    t = now();
    for (long r = 0; r < n; ++r) {
        _Pragma("GCC unroll 32") for (int i = 0; i < C; ++i) f[i] = _mm512_dpbf16_ps(f[i], (__m512bh)w, (__m512bh)x);
        KEEP(f);
    }
    printf("VDPBF16PS %.2f\n", n * C / (now() - t) / 1e9);
    return 0;
}
"""


def instruction_rates() -> dict[str, float]:
    """G instructions/s of one core, per instruction."""
    compiler = build._compiler()
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "peak.c", Path(tmp) / "peak"
        source.write_text(PROGRAM.replace("CHAINS_HERE", str(CHAINS)))
        subprocess.run([compiler, "-O2", "-x", "c++", str(source), "-o", str(binary)], check=True)
        out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {name: float(rate) for name, rate in (line.split() for line in out.splitlines())}


def product_rates(N: int, K: int) -> dict[int, float]:
    """G VPDPBUSD/s per core the VNNI int4 product (columns layout) sustains at M rows, from L2."""
    lib = build.load()
    if lib is None or build.kernels_in_use().get("grouped") != "vnni":
        raise SystemExit("the VNNI grouped kernels do not run here")
    G = 32
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    scale, offset = torch.rand(N * K // G) * 0.01, torch.rand(N * K // G) * 0.01
    rates = {}
    for M in (1, 4, 8, 16):
        x, y = torch.randn(M, K).bfloat16(), torch.empty(M, N, dtype=torch.bfloat16)

        def call(x: torch.Tensor = x, y: torch.Tensor = y, M: int = M) -> None:
            lib.linear_grouped(x.data_ptr(), 1, w.data_ptr(), 1, 4, 0, scale.data_ptr(), offset.data_ptr(), None,
                               None, G, None, y.data_ptr(), 1, N, M, N, K)
        best = float("inf")
        for _ in range(5):
            for _ in range(20):
                call()
            start = time.perf_counter()
            for _ in range(200):
                call()
            best = min(best, (time.perf_counter() - start) / 200)
        rates[M] = M * N * K / 64 / best / torch.get_num_threads() / 1e9
    return rates


def main() -> None:
    N, K = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (1536, 576)
    torch.set_num_threads(2)
    peak = instruction_rates()
    print(f"{build.cpu_model()}, one core, {CHAINS} chains: " + ", ".join(f"{k} {v:.2f} G/s" for k, v in peak.items()))
    rates = product_rates(N, K)
    ceiling = max(peak["VPDPBUSD"], *rates.values())  # the loop above is a lower bound of the core's rate
    for M, rate in rates.items():
        print(f"int4 product {N} x {K} (in L2), {M:2d} rows: {rate:.2f} G VPDPBUSD/s a core "
              f"({rate / ceiling:.0%} of the fastest seen, {ceiling:.2f})", flush=True)


if __name__ == "__main__":
    main()
