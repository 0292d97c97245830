"""Which kernel a fast (not exact) projection runs on: PyTorch's (F.linear, or oneDNN's packed
weight) or the batch-invariant one (rows.cpp), chosen per weight shape, dtype, pass width and
thread count by timing both on this machine at first use, and remembered for the process.

Why measure: the winner differs by CPU and width. Measured on an AMD EPYC (Zen 3, AVX2, no
AVX-512; scripts/linear_costs.py): PyTorch's bf16 product costs about as much per row as a
whole 1-row pass (no batching benefit without native bf16), while the invariant kernel reads
the weight once for all rows: SmolLM2's projections, 2 threads, invariant / F.linear ms for
1, 4, 8, 16, 32 rows: 20.4 / 19.0, 24.3 / 55.9, 37.3 / 124, 45.7 / 220, 79.8 / 450 (a 256-token
prefill pass 0.75 s / 3.6 s). On CPUs where oneDNN has native bf16 its packed kernel may win."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdec.kernels import invariant

# Widths up to MAX_ROWS are timed one by one; wider passes (prefill chunks) share one choice, timed
# on WIDE_ROWS rows of the first of them, so that a new prompt length is never timed again.
MAX_ROWS, WIDE_ROWS = 32, 64
REPEATS = 3
_choice: dict[tuple, bool] = {}


def _seconds(fn: Callable[[], object]) -> float:
    fn()  # warm: first touches, lazy packing
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def prefers_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      packed: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None) -> bool:
    """Whether the invariant kernel computes x @ weight.T + bias faster here than PyTorch's (packed:
    the weight packed for oneDNN, called as packed(x, bias); else F.linear). Timed once per shape,
    dtype, width and thread count, on x itself; later calls are one dictionary lookup."""
    m = x.numel() // x.shape[-1]
    key = (weight.shape, weight.dtype, x.dtype, min(m, MAX_ROWS + 1), torch.get_num_threads())
    choice = _choice.get(key)
    if choice is None:
        choice = _choice[key] = _time_both(x, weight, bias, packed)
    return choice


def _time_both(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed) -> bool:
    if weight.dtype not in invariant.WEIGHT_KERNELS or x.device.type != "cpu" or invariant.load() is None:
        return False
    rows = x.reshape(-1, x.shape[-1])
    rows = rows[:rows.shape[0] if rows.shape[0] <= MAX_ROWS else WIDE_ROWS]
    with torch.inference_mode():
        ours = _seconds(lambda: invariant.linear(rows, weight, bias=bias))
        if packed is not None:
            theirs = _seconds(lambda: packed(rows, bias))
        else:
            theirs = _seconds(lambda: F.linear(rows, weight, bias))
    return ours < theirs


def choices() -> dict[tuple, bool]:
    """What was chosen so far: (weight shape, weight dtype, input dtype, rows (MAX_ROWS + 1: wider),
    threads) -> invariant (False also where the kernels do not apply)."""
    return dict(_choice)
