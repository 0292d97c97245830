"""Batch-invariant kernels for exact mode: every row of a pass gets, bit for bit, the output a
1-token pass gives it, so greedy speculative decoding equals plain decoding in any dtype.

Two things make a row's result depend on the pass around it on this CPU (measured, see
tests/test_models.py): attention kernels block their reduction by the number of keys, so a
row scored inside a wider pass (extra keys masked) rounds differently; and matrix
multiplications choose their blocking of the reduction dimension from the number of rows once
it is large (bfloat16: reductions longer than 1024 change with the row count; float32: passes
under 16 rows take other kernels than wider ones). So in exact mode each row attends alone
(attend_rows), and every projection runs through a plan checked at first use for its weight
shape (row_invariant_plan): the reduction split into chunks the kernels treat alike for every
row count, partial products summed in float32 in a fixed order, and passes narrower than a
minimum padded."""
from __future__ import annotations

import warnings
from functools import partial

import torch
import torch.nn.functional as F

from specdec.models.packed import PackedWeight

# pass widths decoding uses: plain steps, chains of up to 8 drafts, trees of up to 64 nodes
PROBE_ROWS = (2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 33, 48, 65)
_plans: dict[tuple, tuple[int, int]] = {}  # by shape, dtype, device and threads
_weight_plans: dict[tuple, tuple[int, int]] = {}  # by weight and threads: one dict lookup per call


def attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query row per sequence, q [B, nh, 1, hd], over all of k, v [B, nkv, L, hd] (grouped
    query heads: head h reads kv head h // (nh / nkv)), in at least float32. Plain decoding and
    exact mode's rows both attend through it. Measured here (9 heads over 3 kv heads, 2 threads):
    SDPA's fused CPU kernel on bfloat16 inputs takes 90 us at L = 200 and 430 us at L = 1000
    for a single query, on float32 inputs 13 us and 47 us; converting the bf16 cache and calling
    it in float32 takes 24 us and 73 us, against 35 us and 80 us for matmul-softmax-matmul in
    float32, with the same error against a float64 reference (scores rounded to bf16 instead
    would be 8x less accurate)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), enable_gqa=k.shape[1] != q.shape[1])
    return out.to(q.dtype)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_keys: list[int | torch.Tensor]) -> torch.Tensor:
    """Exact mode's attention for the new rows q [B, nh, T, hd] over k, v (in at least float32,
    converted once by the caller): each row alone over exactly the keys it may see, in cache
    order, through attend_row: the same call, on the same values, as plain decoding's 1-token
    pass at that position. row_keys[i]: n = the first n cache positions, or the positions
    (tree rows)."""
    B, nh, T, hd = q.shape
    nkv = k.shape[1]
    q_rows = q.to(k.dtype)  # converted once for every row (same values as each row's own conversion)
    flat_k, flat_v = k.flatten(0, 1), v.flatten(0, 1)
    outs = []
    for i, keys in enumerate(row_keys):
        if isinstance(keys, int):
            k_row, v_row = k[:, :, :keys], v[:, :, :keys]
        else:  # over [B*nkv, L, hd]: index_select's CPU kernel on the 4-d tensor took ~8x longer here
            k_row, v_row = (t.index_select(1, keys).view(B, nkv, -1, hd) for t in (flat_k, flat_v))
        outs.append(attend_row(q_rows[:, :, i:i + 1], k_row, v_row))
    return torch.cat(outs, 2).to(q.dtype)


def exact_row_keys(T: int, past: int, attn_mask: torch.Tensor | None) -> list[int | torch.Tensor]:
    """Per new row, the cache positions it attends to (see attend_rows)."""
    if attn_mask is None:
        return [past + i + 1 for i in range(T)]
    prefix = torch.arange(past, device=attn_mask.device)
    return [torch.cat([prefix, past + row.nonzero()[:, 0]]) for row in attn_mask.to(torch.bool)]


def _planned_linear(x: torch.Tensor, weight: torch.Tensor, k_chunk: int, min_rows: int,
                    packed: PackedWeight | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T under a plan (see row_invariant_plan); packed: the same products, faster."""
    m = x.shape[0]
    if m < min_rows:
        x = torch.cat([x, x[:1].expand(min_rows - m, -1)])
    if k_chunk >= x.shape[1]:
        y = packed(x) if packed is not None else F.linear(x, weight)
    else:
        chunks = packed.chunks(k_chunk) if packed is not None else None
        products = chunks or [partial(F.linear, weight=wc) for wc in weight.split(k_chunk, 1)]
        parts = [product(xc).float() for xc, product in zip(x.split(k_chunk, 1), products)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part  # fixed order: the same sum for every row
        y = total.to(x.dtype)
    return y[:m]


def _row_invariant(weight: torch.Tensor, k_chunk: int, min_rows: int, packed: PackedWeight | None) -> bool:
    g = torch.Generator(device=weight.device).manual_seed(0)
    for m in PROBE_ROWS:
        x = torch.randn(m, weight.shape[1], generator=g, device=weight.device).to(weight.dtype)
        full = _planned_linear(x, weight, k_chunk, min_rows, packed)
        for r in {0, m // 2, m - 1}:
            if not torch.equal(_planned_linear(x[r:r + 1], weight, k_chunk, min_rows, packed)[0], full[r]):
                return False
    return True


@torch.inference_mode()
def row_invariant_plan(weight: torch.Tensor, packed: PackedWeight | None = None) -> tuple[int, int]:
    """(reduction chunk, minimum rows) under which this weight's products are row-invariant
    here: the cheapest candidate that passes a check over the pass widths decoding uses (the
    failures are systematic, from kernel blocking, so random inputs reveal them). Cached by
    shape, dtype, thread count and kernel (F.linear or the packed weight's), which is what
    the kernels choose by."""
    n, k = weight.shape
    key = (n, k, weight.dtype, weight.device.type, torch.get_num_threads(), packed is not None)
    if key not in _plans:
        chunks = [k] + [c for c in (1024, 768, 512) if c < k]
        candidates = [(c, rows) for rows in (1, 4, 8, 16) for c in chunks]
        plan = next((c for c in candidates if _row_invariant(weight, *c, packed)), None)
        if plan is None:
            warnings.warn(f"exact mode: no row-invariant plan found for a {n}x{k} {weight.dtype} matmul on "
                          "this machine; greedy output may differ from plain decoding", stacklevel=2)
            plan = (k, 1)
        _plans[key] = plan
    return _plans[key]


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 packed: PackedWeight | None = None) -> torch.Tensor:
    """F.linear whose every row is computed alike whatever the number of rows (packed: the
    weight packed for oneDNN, see packed.py; its plan is checked on its own kernel)."""
    # kernels choose by threads too
    key = (weight.data_ptr(), weight.shape, weight.dtype, torch.get_num_threads(), packed is not None)
    plan = _weight_plans.get(key)
    if plan is None:
        plan = _weight_plans[key] = row_invariant_plan(weight, packed)
    k_chunk, min_rows = plan
    if k_chunk >= weight.shape[1] and min_rows == 1:  # the kernels are row-invariant as they are
        return packed(x, bias) if packed is not None else F.linear(x, weight, bias)
    y = _planned_linear(x.reshape(-1, x.shape[-1]), weight, k_chunk, min_rows, packed)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y + bias if bias is not None else y
