"""Which instruction sequence rows.cpp's products run where this CPU offers more than one, chosen
once per machine by timing them: "bf16", bfloat16 weights and inputs through tile() (AVX2 + FMA),
AMX tiles (amx_linear) or AVX-512 BF16 dot products (dp_linear); "grouped", GGUF-style grouped
weights row-major through the AVX2 integer kernels (qtile, ktile), or laid out by columns at load
(Grouped.in_columns) for AVX-512 VNNI (vnni_glinear), or for AVX2 alone where the weights are
4-bit groups (a K-quant's two levels, or one) or Q8_0's ("avx2-columns", avx2_super_glinear,
avx2_group_glinear, avx2_signed_glinear: VNNI's bits on 8 lanes; on an AVX2-only AMD EPYC Zen 3,
Qwen2.5-Coder-1.5B's 1- / 8-token passes 61.0 / 209.1 -> 53.1 / 138.8 ms, SmolLM2's --quantize
int4 / int8 8-token passes 0.59-0.63x / 0.69-0.83x the time). Timed on Q4_K's shape alone. (Tried
and not kept: GGUF's blocks dequantized to bfloat16 for AMX, flat in the rows but 9x slower than
the 8-bit integer kernel at one row on Qwen2.5-Coder-1.5B; AMX-INT8 tiles a group at a time, flat
but 3x slower than AVX2 at one row: 16 vs 5.4 ms over 96 MB of Q4_K-layout weights.)

Why measure: AMX reads a weight once for up to 16 rows at no extra arithmetic cost, but streams
a single row no faster than AVX2 (measured on an Intel Xeon with AMX, 2 threads, SmolLM2's
projections: AVX2 1 / 4 / 8 rows 5.0 / 8.4 / 15.1 ms, AMX 5.0-7 / 5.4 / 5.8 ms), and the balance
differs by CPU and memory. AVX-512 BF16 dot products stream one row fastest but turn
compute-bound by 8 rows where a core has one 512-bit FMA port (same CPU, whole SmolLM2 passes at
1 / 4 / 8 tokens, one process, scripts/kernel_ab.py, bench/results/kernel_ab_stop61.txt: AVX2
10.4 / 13.8 / 23.3 ms, AMX 8.9 / 10.0 / 11.1, AVX-512 BF16 8.3 / 11.4 / 18.4); CPUs with AVX-512
BF16 but no AMX (AMD Zen 4) have only them beside AVX2. VNNI's columns cut the integer work per
extra row (one VPDPBUSD for 16 outputs x 4 inputs) but cost a little at one row (4.8 vs 4.55 ms).
So each runs over weights larger than the caches at the widths speculation uses, and the fastest
in sum wins. A row's bits depend on the choice, so it is made once, before any product (and any
weight's layout), and remembered beside the built library for every later process on this
machine (processes starting together wait for the first to measure).
"grouped_wide": where VNNI runs the columns layout, its full 16-row chunks (prefill, wide verify
passes) on AMX-INT8 tiles or not: the same integer dots and float steps, so the same bits.
"attention": scores and weighted values on 8 lanes (AVX2) or 16 (AVX-512, head sizes up to 128 in
multiples of 16: one FMA a key and 16 dims, sixteen keys' sums added in one tree instead of a
horizontal sum a key; a score's bits differ between the two). Measured on an AMD EPYC Zen 5, 2
threads, whole SmolLM2 passes over 1,000 / 2,000 cached tokens (bench/results/kernels_stop65_zen5.txt):
8-token pass 14.5 -> 13.0 ms and 22.0 -> 18.2 ms; one layer's attention alone 1.2-1.5x. Or
"avx512bf16" (CPUs with AVX-512 BF16; bfloat16 caches, head sizes a multiple of 32): VDPBF16PS for
scores and weighted values on the cached values as they lie, the query and the softmax's weights
rounded to bfloat16 once (as a bfloat16 model's own attention does): half the instructions, no
conversion. Same machine, one layer alone (scripts/attention_ab.py micro) 1.4-2.0x "avx512"'s;
Qwen2.5-Coder-1.5B passes after 2,000 cached tokens, 4 / 8 tokens 33.5 / 44.2 -> 27.2 / 37.2 ms.
"tile_prefetch", "dp_prefetch" and "grouped_prefetch": whether the AVX2, AVX-512 BF16 and VNNI
products ask for their weights ahead into L1 ("l1") or into L2 only ("l2"); the same bits either way.
On an AMD EPYC Zen 4 "l2" made SmolLM2's 1-token pass 0.86-0.87x (AVX2) and 0.89-0.99x (AVX-512 BF16)
the time and its 8-token pass 1.01x / 0.80x, and Qwen2.5-Coder's 5-token pass 0.86-0.96x (rows.cpp, at
tile_prefetch, dp_prefetch and grouped_prefetch); other CPUs measure it.
SPECDEC_BF16_KERNEL=avx2|amx|avx512, SPECDEC_GROUPED_KERNEL=avx2|vnni|avx2-columns,
SPECDEC_GROUPED_WIDE_KERNEL=vnni|amx, SPECDEC_ATTENTION_KERNEL=avx2|avx512|avx512bf16,
"dp_tail": whether AVX-512 BF16 products past 4 rows end in tiles of 1-2 rows ("split") or of 5-6
("whole"); the same bits. On an AMD EPYC Zen 5 "whole" made SmolLM2's 5- / 6-token passes 0.87-0.90x /
0.84-0.90x the time (a 1-row tile's one sum a column in flight is bound by the dot products' latency).
SPECDEC_TILE_PREFETCH_KERNEL, SPECDEC_DP_PREFETCH_KERNEL and SPECDEC_GROUPED_PREFETCH_KERNEL=l1|l2,
SPECDEC_DP_TAIL_KERNEL=split|whole set them by hand."""
from __future__ import annotations

import ctypes
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

WIDTHS = (1, 4, 8)
REPEATS = 3


def _seconds(call: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first warms
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _bf16_pass(lib: ctypes.CDLL, kernel: str) -> Callable[[int], float]:
    """Seconds of M rows through 96 MB of bfloat16 weights (beyond the caches), on the kernel set."""
    import torch

    N, K = 2048, 2048
    weights = [torch.full((N, K), 0.01, dtype=torch.bfloat16) for _ in range(12)]

    def seconds(M: int) -> float:
        x, y = torch.full((M, K), 0.5, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
        return _seconds(lambda: [lib.linear_bf16(x.data_ptr(), 1, w.data_ptr(), None, y.data_ptr(), 1, M, N, K)
                                 for w in weights])
    return seconds


def _bf16_layers_pass(lib: ctypes.CDLL, kernel: str) -> Callable[[int], float]:
    """Seconds of M rows through 16 layers' worth of a small model's projections in bfloat16 (SmolLM2's
    shapes: gate/up, down, q/k/v, o; 113 MB, beyond the caches), on the kernel set. Where the weights are
    asked for ahead and how the row tiles end depend on the shapes: on an AMD EPYC Zen 5, _bf16_pass's
    2048 x 2048 matrices timed "l1" and "l2" alike by the VM's noise, while these, like SmolLM2's passes,
    time "l2" 1.09x / 1.32x slower at 4 / 8 rows."""
    import torch

    shapes = [(3072, 576), (576, 1536), (960, 576), (576, 576)] * 16
    weights = [torch.full(shape, 0.01, dtype=torch.bfloat16) for shape in shapes]

    def seconds(M: int) -> float:
        xs = {K: torch.full((M, K), 0.5, dtype=torch.bfloat16) for K in (576, 1536)}
        ys = {N: torch.empty(M, N, dtype=torch.bfloat16) for N in (3072, 960, 576)}
        return _seconds(lambda: [lib.linear_bf16(xs[w.shape[1]].data_ptr(), 1, w.data_ptr(), None,
                                                 ys[w.shape[0]].data_ptr(), 1, M, w.shape[0], w.shape[1])
                                 for w in weights])
    return seconds


def _grouped_pass(lib: ctypes.CDLL, kernel: str) -> Callable[[int], float]:
    """Seconds of M rows through 96 MB of 4-bit weights in Q4_K's layout (two levels of scales,
    offsets; Qwen2.5-Coder's bulk), row-major for "avx2", in the columns layout for "vnni" and
    "avx2-columns" (the bytes are all alike: the same tensors serve as either)."""
    import torch

    N, K, G = 4096, 4096, 32
    weights = [torch.full((N, K // 2), 0x37, dtype=torch.uint8) for _ in range(12)]
    scale, offset = torch.full((N, K // G), 3, dtype=torch.int8), torch.full((N, K // G), 2, dtype=torch.int8)
    scale_super, offset_super = torch.full((N, K // 256), 0.01), torch.full((N, K // 256), -0.01)

    def seconds(M: int) -> float:
        x, y = torch.full((M, K), 0.5, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)

        def run() -> None:
            for w in weights:
                lib.linear_grouped(x.data_ptr(), 1, w.data_ptr(), int(kernel != "avx2"), 4, 0, scale.data_ptr(),
                                   offset.data_ptr(), scale_super.data_ptr(), offset_super.data_ptr(), G, None,
                                   y.data_ptr(), 1, N, M, N, K)
        return _seconds(run)
    return seconds


def _attention_pass(lib: ctypes.CDLL, kernel: str) -> Callable[[int], float]:
    """Seconds of M rows of one sequence (a verify pass) attending over 1,024 cached keys with
    Qwen2.5-Coder-1.5B's heads (12 query heads on 2 kv heads of 128), 28 layers' worth."""
    import torch

    nh, nkv, hd, L = 12, 2, 128, 1024
    k, v = (torch.full((nkv, L, hd), 0.01, dtype=torch.bfloat16) for _ in range(2))

    def seconds(M: int) -> float:
        q, out = torch.full((M, nh, hd), 0.02), torch.empty(M, nh, hd, dtype=torch.bfloat16)
        base = torch.zeros(M, dtype=torch.int64)
        count = torch.arange(L - M + 1, L + 1, dtype=torch.int64)
        return _seconds(lambda: [lib.attend_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), base.data_ptr(),
                                                 count.data_ptr(), None, None, out.data_ptr(), 1, M, nh, nkv, hd, hd,
                                                 L * hd, hd ** -0.5) for _ in range(28)])
    return seconds


@dataclass(frozen=True)
class Variant:
    name: str
    kernels: tuple[str, ...]  # rows.cpp's 0, 1, ...
    setter: str  # rows.cpp's function that sets it (returns the kernel in use)
    timing: Callable[[ctypes.CDLL, str], Callable[[int], float]]  # set-up for a kernel, then seconds for M rows
    cpu_flags: tuple[frozenset[str], ...]  # what each kernel after the first needs (its target attribute)
    widths: tuple[int, ...] = WIDTHS  # rows a product, the widths timed
    needs: tuple[str, str] | None = None  # (variant, kernel) chosen first, else the first kernel stays

    def set(self, lib: ctypes.CDLL, kernel: str) -> str:
        return self.kernels[getattr(lib, self.setter)(self.kernels.index(kernel))]

    def runnable(self, cpu_flags: set[str]) -> list[str]:
        """The kernels whose instructions this CPU has (the first needs only AVX2 + FMA)."""
        return [self.kernels[0]] + [kernel for kernel, needs in zip(self.kernels[1:], self.cpu_flags)
                                    if needs <= cpu_flags]

    def measure(self, lib: ctypes.CDLL, cpu_flags: set[str]) -> dict[str, float]:
        """Seconds summed over the widths per kernel this machine can run (AMX where Linux grants it)."""
        seconds = {}
        for kernel in self.runnable(cpu_flags):
            if self.set(lib, kernel) == kernel:
                seconds_for = self.timing(lib, kernel)
                seconds[kernel] = sum(seconds_for(M) for M in self.widths)
        return seconds


VARIANTS = (
    Variant("bf16", ("avx2", "amx", "avx512"), "set_bf16_kernel", _bf16_pass,
            (frozenset({"amx_bf16", "amx_tile", "avx512f", "avx512bw"}),
             frozenset({"avx512f", "avx512bw", "avx512_bf16"}))),
    Variant("grouped", ("avx2", "vnni", "avx2-columns"), "set_grouped_kernel", _grouped_pass,
            (frozenset({"avx512f", "avx512bw", "avx512_vnni"}), frozenset())),
    # full 16-row chunks of the columns layout on AMX-INT8 tiles: the same bits, so only speed differs
    Variant("grouped_wide", ("vnni", "amx"), "set_grouped_wide_kernel", lambda lib, kernel: _grouped_pass(lib, "vnni"),
            (frozenset({"avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8"}),), widths=(16, 64),
            needs=("grouped", "vnni")),
    Variant("attention", ("avx2", "avx512", "avx512bf16"), "set_attention_kernel", _attention_pass,
            (frozenset({"avx512f", "avx512bw"}), frozenset({"avx512f", "avx512bw", "avx512_bf16"}))),
    # where the products ask for the weights ahead: into L1 or L2 (rows.cpp tile_prefetch,
    # dp_prefetch, grouped_prefetch); the same bits, so only speed differs
    Variant("tile_prefetch", ("l1", "l2"), "set_tile_prefetch", _bf16_layers_pass,
            (frozenset(),), widths=(1, 4, 8), needs=("bf16", "avx2")),
    Variant("dp_prefetch", ("l1", "l2"), "set_dp_prefetch", _bf16_layers_pass,
            (frozenset(),), widths=(1, 4, 8), needs=("bf16", "avx512")),
    Variant("grouped_prefetch", ("l1", "l2"), "set_grouped_prefetch", lambda lib, kernel: _grouped_pass(lib, "vnni"),
            (frozenset(),), widths=(3, 5, 8), needs=("grouped", "vnni")),
    # how AVX-512 BF16 products past 4 rows end: in 1- or 2-row tiles ("split") or one 5- or 6-row
    # tile ("whole"; rows.cpp dp_tail); the same bits
    Variant("dp_tail", ("split", "whole"), "set_dp_tail", _bf16_layers_pass,
            (frozenset(),), widths=(5, 6), needs=("bf16", "avx512")),
)


def choose(lib: ctypes.CDLL, variant: Variant, library: Path, cpu_flags: set[str], key: str,
           chosen: dict[str, str] | None = None) -> str:
    """Sets and returns the kernel of `variant` for this process: the environment's, else the one
    remembered for this library and key (CPU model, threads), else the faster by measure().
    chosen: the variants set before it (what `needs` refers to)."""
    runnable = variant.runnable(cpu_flags)
    if len(runnable) == 1:  # the other kernels' instructions are missing here
        return variant.set(lib, variant.kernels[0])
    if variant.needs is not None and (chosen or {}).get(variant.needs[0]) != variant.needs[1]:
        return variant.set(lib, variant.kernels[0])
    forced = os.environ.get(f"SPECDEC_{variant.name.upper()}_KERNEL", "").lower()
    if forced in runnable:
        return variant.set(lib, forced)
    remembered = library.with_name(f"{library.stem}.{key}.{variant.name}-kernel")
    try:
        lock = open(remembered.with_suffix(".lock"), "w")
    except OSError:
        lock = None  # a read-only cache: this process measures, the next measures again
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting together: one measures, the rest read
        kernel = _remembered(remembered, runnable)
        if kernel is None:
            seconds = variant.measure(lib, cpu_flags)
            kernel = min(seconds, key=seconds.get)
            if lock is not None:
                partial = remembered.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(kernel + "\n")
                os.replace(partial, remembered)
        return variant.set(lib, kernel)
    finally:
        if lock is not None:
            lock.close()


def _remembered(path: Path, runnable: list[str]) -> str | None:
    try:
        kernel = path.read_text().strip()
    except OSError:
        return None
    return kernel if kernel in runnable else None
