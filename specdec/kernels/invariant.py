"""Tensor-level calls into rows.cpp's batch-invariant kernels (see its header for why each
output row's bits do not depend on the rest of the call). Every function returns None where
the kernels do not apply (not built here, or a dtype they do not take); the caller then uses
its own row-at-a-time path."""
from __future__ import annotations

import torch

from specdec.kernels.build import load

WEIGHT_KERNELS = {torch.bfloat16: "linear_bf16", torch.float32: "linear_f32", torch.int8: "linear_i8"}
CACHE_KERNELS = {torch.bfloat16: "attend_bf16", torch.float32: "attend_f32"}


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [..., K] @ weight.T in float32 ([..., N]); weight [N, K] bfloat16, float32 or int8 (then
    times scale [N], one per output row). None where the kernels do not apply."""
    lib = load()
    name = WEIGHT_KERNELS.get(weight.dtype)
    if lib is None or name is None or x.device.type != "cpu" or (name == "linear_i8") != (scale is not None):
        return None
    N, K = weight.shape
    rows = x.reshape(-1, K).to(torch.float32).contiguous()
    weight = weight.contiguous()
    out = torch.empty(rows.shape[0], N, dtype=torch.float32)
    if scale is None:
        getattr(lib, name)(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), rows.shape[0], N, K)
    else:
        scale = scale.to(torch.float32).contiguous()
        lib.linear_i8(rows.data_ptr(), weight.data_ptr(), scale.data_ptr(), out.data_ptr(), rows.shape[0], N, K)
    return out.view(*x.shape[:-1], N)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: list[int],
           keys: list[torch.Tensor] | None = None) -> torch.Tensor | None:
    """Attention of query rows q [B, nh, T, hd] over the caches k, v [B, nkv, L, hd] (views of
    one layout; grouped-query heads: head h reads kv head h // (nh / nkv)). Row t of sequence b
    (flat index b * T + t) sees keys 0 .. counts[i] - 1, or with keys, the cache positions
    keys[i] (in cache order); a count of 0 gives zeros. Float32 out [B, nh, T, hd]; None where
    the kernels do not apply."""
    lib = load()
    name = CACHE_KERNELS.get(k.dtype)
    if lib is None or name is None or k.device.type != "cpu" or v.dtype != k.dtype or k.stride(3) != 1:
        return None
    if v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    B, nh, T, hd = q.shape
    rows = q.transpose(1, 2).to(torch.float32).contiguous()  # [B, T, nh, hd]
    base = torch.arange(B).repeat_interleave(T) * k.stride(0)
    count = torch.tensor(counts, dtype=torch.int64)
    start = index = None
    if keys is not None:
        lengths = torch.tensor([len(row) for row in keys], dtype=torch.int64)
        start = torch.cumsum(lengths, 0) - lengths
        index = torch.cat([row.to(torch.int64) for row in keys]) if keys else torch.zeros(0, dtype=torch.int64)
        count = lengths
    out = torch.empty_like(rows)
    getattr(lib, name)(rows.data_ptr(), k.data_ptr(), v.data_ptr(), base.data_ptr(), count.data_ptr(), _ptr(start),
                       _ptr(index), out.data_ptr(), B * T, nh, k.shape[1], hd, k.stride(2), k.stride(1),
                       hd ** -0.5)
    return out.transpose(1, 2)
