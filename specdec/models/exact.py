"""Exact mode: every row of a pass gets, bit for bit, the output a 1-token pass gives it, so
greedy speculative decoding equals plain decoding in any dtype, on any CPU.

By construction, not by probing: attention and projections run on kernels whose reduction
order for a row is fixed whatever the other rows of the call are (kernels/rows.cpp), and where
those kernels do not apply (float64, int4 weights, no compiler, SPECDEC_KERNELS=off) each row
is computed alone, by the same PyTorch call with the same shapes a 1-token pass makes. A row's
attention sees exactly its keys, in cache order: a chain row's first n cache positions, a tree
row's prefix and ancestors (TreeRows), a batched slot's own cache (attend_counted)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from specdec.kernels import invariant
from specdec.models import row_attention


def attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query row per sequence, q [B, nh, 1, hd], over all of k, v [B, nkv, L, hd] (grouped
    query heads: head h reads kv head h // (nh / nkv)), in at least float32: plain decoding's
    attention with the fast kernels (exact mode's is exact_attend_row). On bf16 caches it runs
    in row_attention's kernel, which reads the cache without a float32 copy."""
    if row_attention.supports(q, k):
        return row_attention.attend_row_bf16(q, k, v)
    return row_attention.reference_attend_row(q, k, v)


def _fresh(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous copy in dtype: a row computed alone always reads its inputs from the same
    kind of buffer, whatever view it came from."""
    return torch.empty(t.shape, dtype=dtype, device=t.device).copy_(t)


def _row_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The row-at-a-time definition: q [1, nh, 1, hd] over k, v [1, nkv, n, hd] in at least
    float32 (SDPA on fresh copies), out in float32 or wider."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    if k.shape[2] == 0:
        return torch.zeros(q.shape, dtype=dtype, device=q.device)
    return F.scaled_dot_product_attention(_fresh(q, dtype), _fresh(k, dtype), _fresh(v, dtype),
                                          enable_gqa=k.shape[1] != q.shape[1])


Counts = tuple[tuple[int, ...], ...]  # counts[b][t]: row t of sequence b sees keys [0, counts[b][t])


def attend_counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: Counts) -> torch.Tensor:
    """Rows q [B, nh, T, hd] over k, v [B, nkv, L, hd], row t of sequence b seeing the first
    counts[b][t] keys of its own cache, each with a 1-token pass's bits (rows t >=
    len(counts[b]) are padding: left zero)."""
    B, nh, T, hd = q.shape
    flat = [row[t] if t < len(row) else 0 for row in counts for t in range(T)]
    out = invariant.attend(q, k, v, flat)
    if out is not None:
        return out
    out = torch.zeros_like(q)
    for b, row in enumerate(counts):
        for t, c in enumerate(row):
            out[b:b + 1, :, t:t + 1] = _row_alone(q[b:b + 1, :, t:t + 1], k[b:b + 1, :, :c], v[b:b + 1, :, :c])
    return out


def exact_attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """attend_row's job in exact mode (plain decoding's step): the definition every exact row
    reproduces bit for bit, alone, in a chain, a tree or beside other sequences."""
    return attend_counted(q, k, v, ((k.shape[2],),) * q.shape[0])


@dataclass(frozen=True, eq=False)  # hashed by identity: one per pass
class TreeRows:
    """A tree pass's new rows: row i sees the cache's first `past` keys and the new rows
    seen[i] (bool [T, T]: itself and its ancestors)."""
    past: int
    seen: torch.Tensor

    @cached_property
    def positions(self) -> list[torch.Tensor]:
        """Per row, the cache positions it attends to, in cache order (once per pass, shared by
        its layers)."""
        prefix = torch.arange(self.past, device=self.seen.device)
        return [torch.cat([prefix, self.past + row.nonzero()[:, 0]]) for row in self.seen]

    @cached_property
    def key_lists(self) -> invariant.KeyLists:
        """positions as the invariant kernel reads them, for one sequence (once per pass)."""
        return invariant.key_lists(self.positions)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                row_keys: list[int | torch.Tensor] | TreeRows) -> torch.Tensor:
    """Exact mode's attention for the new rows q [B, nh, T, hd] over k, v: each row over exactly
    the keys it may see, in cache order, with exact_attend_row's bits. row_keys: a tree pass's
    TreeRows, or per row n = the first n cache positions, or the positions (the same for
    every sequence of the batch)."""
    B, nh, T, hd = q.shape
    lists = None
    if isinstance(row_keys, TreeRows):
        lists = row_keys.key_lists if B == 1 else None
        row_keys = row_keys.positions
    if all(isinstance(keys, int) for keys in row_keys):  # a chain
        return attend_counted(q, k, v, (tuple(row_keys),) * B)
    positions = [torch.arange(keys) if isinstance(keys, int) else keys for keys in row_keys]
    out = invariant.attend(q, k, v, [], lists or invariant.key_lists(positions * B))
    if out is not None:
        return out
    out = torch.empty_like(q)
    for t, keys in enumerate(positions):
        for b in range(B):
            out[b:b + 1, :, t:t + 1] = _row_alone(q[b:b + 1, :, t:t + 1], k[b:b + 1, :, keys], v[b:b + 1, :, keys])
    return out


def exact_row_keys(T: int, past: int, attn_mask: torch.Tensor | None) -> list[int] | TreeRows:
    """The keys each new row attends to (see attend_rows): a chain's key counts, or a tree's rows."""
    if attn_mask is None:
        return [past + i + 1 for i in range(T)]
    return TreeRows(past, attn_mask.to(torch.bool))


def rows_alone(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """product (a [1, K] -> [1, N] projection) applied to each row of x [M, K] on its own, on a
    fresh copy: every row gets what a 1-row call gives it."""
    return torch.cat([product(_fresh(row[None], row.dtype)) for row in x])


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear whose every row is computed alike whatever the number of rows: the invariant
    kernel (float32 sums, bias added, one rounding to x's dtype), else one F.linear call per row."""
    y = invariant.linear(x, weight, bias=bias)
    if y is not None:
        return y
    y = rows_alone(lambda row: F.linear(row, weight, bias), x.reshape(-1, x.shape[-1]))
    return y.reshape(*x.shape[:-1], weight.shape[0])
