"""Which instruction sequence rows.cpp's bfloat16 products (bfloat16 weights and inputs) run:
tile() on AVX2 + FMA, or AMX tiles where the CPU has amx-bf16 and Linux grants them.

Why measure: AMX reads a weight once for up to 16 rows at no extra arithmetic cost, but streams
a single row no faster than AVX2 does (measured on an Intel Xeon with AMX, 2 threads, SmolLM2's
projections: AVX2 1 / 4 / 8 rows 5.0 / 8.4 / 15.1 ms, AMX 5.0-7 / 5.4 / 5.8 ms), and the balance
differs by CPU and memory. So both run once over weights larger than the caches at the widths
speculation uses, and the faster in sum wins. A row's bits depend on the choice, so it is made
once, before any product, and remembered beside the built library for every later process on
this machine. SPECDEC_BF16_KERNEL=avx2|amx sets it by hand."""
from __future__ import annotations

import ctypes
import fcntl
import os
import time
from pathlib import Path

KERNELS = ("avx2", "amx")
WIDTHS = (1, 4, 8)
TIMING_SHAPE, TIMING_WEIGHTS = (2048, 2048), 12  # 96 MB of bfloat16 weights: beyond the caches
REPEATS = 3


def _set(lib: ctypes.CDLL, kernel: str) -> str:
    return KERNELS[lib.set_bf16_kernel(KERNELS.index(kernel))]


def _pass_seconds(lib: ctypes.CDLL, weights: list, M: int) -> float:
    import torch

    N, K = TIMING_SHAPE
    x, y = torch.full((M, K), 0.5, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first warms
        start = time.perf_counter()
        for w in weights:
            lib.linear_bf16(x.data_ptr(), 1, w.data_ptr(), None, y.data_ptr(), 1, M, N, K)
        best = min(best, time.perf_counter() - start)
    return best


def measure(lib: ctypes.CDLL) -> dict[str, float]:
    """Seconds for one pass over the timing weights at each of WIDTHS, summed, per kernel that
    this machine can run (AMX where Linux grants it)."""
    import torch

    weights = [torch.full(TIMING_SHAPE, 0.01, dtype=torch.bfloat16) for _ in range(TIMING_WEIGHTS)]
    seconds = {}
    for kernel in KERNELS:
        if _set(lib, kernel) == kernel:
            seconds[kernel] = sum(_pass_seconds(lib, weights, M) for M in WIDTHS)
    return seconds


def choose(lib: ctypes.CDLL, library: Path, cpu_flags: set[str], key: str) -> str:
    """Sets and returns the kernel for this process: SPECDEC_BF16_KERNEL's, else the one
    remembered for this library and key (CPU model, threads), else the faster by measure()."""
    forced = os.environ.get("SPECDEC_BF16_KERNEL", "").lower()
    if forced in KERNELS:
        return _set(lib, forced)
    if not {"amx_bf16", "amx_tile"} <= cpu_flags:
        return _set(lib, "avx2")
    remembered = library.with_name(f"{library.stem}.{key}.bf16-kernel")
    try:
        lock = open(remembered.with_suffix(".lock"), "w")
    except OSError:
        lock = None  # a read-only cache: this process measures, the next measures again
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting together: one measures, the rest read
        kernel = _remembered(remembered)
        if kernel is None:
            seconds = measure(lib)
            kernel = min(seconds, key=seconds.get)
            if lock is not None:
                partial = remembered.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(kernel + "\n")
                os.replace(partial, remembered)
        return _set(lib, kernel)
    finally:
        if lock is not None:
            lock.close()


def _remembered(path: Path) -> str | None:
    try:
        kernel = path.read_text().strip()
    except OSError:
        return None
    return kernel if kernel in KERNELS else None
