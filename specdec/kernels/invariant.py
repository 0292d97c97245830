"""Tensor-level calls into rows.cpp's batch-invariant kernels (see its header for why each
output row's bits do not depend on the rest of the call). Every function returns None where
the kernels do not apply (not built here, or a dtype they do not take); the caller then uses
its own row-at-a-time path. Inputs and outputs are float32 or bfloat16, read and written by the
kernels themselves (no conversion copies around the call)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specdec.kernels.build import load

WEIGHT_KERNELS = {torch.bfloat16: "linear_bf16", torch.float32: "linear_f32", torch.int8: "linear_i8"}
CACHE_KERNELS = {torch.bfloat16: "attend_bf16", torch.float32: "attend_f32"}
IO_DTYPES = (torch.bfloat16, torch.float32)


def address(t: torch.Tensor | None) -> int | None:
    """A tensor's data address for a kernel argument (None: a null pointer)."""
    return None if t is None else t.data_ptr()


def _float32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.float32).contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """x [..., K] @ weight.T (times scale [N] for int8 weights, plus bias [N]), rounded once to
    out_dtype (default: x's, float32 or bfloat16); weight [N, K] bfloat16, float32 or int8. None
    where the kernels do not apply."""
    lib = load()
    name = WEIGHT_KERNELS.get(weight.dtype)
    out_dtype = out_dtype or x.dtype
    if (lib is None or name is None or x.device.type != "cpu" or x.dtype not in IO_DTYPES
            or out_dtype not in IO_DTYPES or (name == "linear_i8") != (scale is not None)):
        return None
    N, K = weight.shape
    rows = x.reshape(-1, K).contiguous()
    weight = weight.contiguous()
    out = torch.empty(rows.shape[0], N, dtype=out_dtype)
    x_bf16, y_bf16 = int(rows.dtype == torch.bfloat16), int(out_dtype == torch.bfloat16)
    bias = _float32(bias)
    if scale is None:
        getattr(lib, name)(rows.data_ptr(), x_bf16, weight.data_ptr(), address(bias), out.data_ptr(), y_bf16,
                           rows.shape[0], N, K)
    else:
        scale = _float32(scale)
        lib.linear_i8(rows.data_ptr(), x_bf16, weight.data_ptr(), scale.data_ptr(), address(bias), out.data_ptr(),
                      y_bf16, rows.shape[0], N, K)
    return out.view(*x.shape[:-1], N)


def super_width(K: int) -> int:
    """Inputs a superblock of two-level scales spans: 256 (the K-quants') where K allows, else
    128 (a 0.5B Qwen's 896 = 7 x 128); rows.cpp's glinear_any reads them so."""
    return 256 if K % 256 == 0 else 128


def linear_grouped(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                   group: int, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
                   column: int = 0, bits: int = 8, scale_super: torch.Tensor | None = None,
                   offset_super: torch.Tensor | None = None, columns: bool = False) -> torch.Tensor | None:
    """x [M, K] @ W.T (+ bias) for W = q * scale (+ offset) by groups of `group` (16 or 32)
    inputs, x quantized to 8 bits by blocks of 32 as llama.cpp does (rows.cpp): q uint8 [N, K],
    or [N, K / 2] holding 4-bit values (bits=4, groups of 32), or [N, 3K / 4] holding values
    below 64 (bits=6, groups of 16, two levels, columns layout only), or int8 [N, K] without offsets;
    scale and offset float32 [N, K / group] (offset may be None), or int8 times scale_super and
    offset_super float32 [N, K / S] (two levels, superblocks of S = 256 where K allows, else 128:
    super_width); bias float32 [N]; columns: q in the columns layout (Grouped.in_columns). Written
    into out[:, column : column + N] (out [M, >= N], float32 or bfloat16, rows contiguous) when
    given, else into a new [M, N] tensor of x's dtype. None where the kernels do not apply."""
    lib = load()
    if lib is None or x.device.type != "cpu" or x.dtype not in IO_DTYPES or x.dim() != 2 or not x.is_contiguous():
        return None
    N, K = q.shape[0], q.shape[1] * 8 // bits
    if scale_super is not None and scale_super.shape != (N, K // super_width(K)):
        return None  # another superblock width than the kernel's rule
    if out is None:
        out, column = torch.empty(x.shape[0], N, dtype=x.dtype), 0
    if out.dtype not in IO_DTYPES or out.stride(1) != 1:
        return None
    failed = lib.linear_grouped(x.data_ptr(), int(x.dtype == torch.bfloat16), q.data_ptr(), int(columns), bits,
                                int(q.dtype == torch.int8), scale.data_ptr(), address(offset), address(scale_super),
                                address(offset_super), group, address(bias),
                                out.data_ptr() + column * out.element_size(), int(out.dtype == torch.bfloat16),
                                out.stride(0), x.shape[0], N, K)
    return None if failed else out


@lru_cache(maxsize=16)
def _row_layout(B: int, T: int, batch_stride: int, counts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sequence offset and key count, as the kernel reads them: built once per pass
    (its layers share them)."""
    base = torch.arange(B, dtype=torch.int64).repeat_interleave(T) * batch_stride
    return base, torch.tensor(counts, dtype=torch.int64)


@dataclass(frozen=True)
class KeyLists:
    """Per row, the cache positions it attends to, laid out as the kernel reads them: row i's
    are index[start[i] : start[i] + lengths[i]]."""
    lengths: torch.Tensor
    start: torch.Tensor
    index: torch.Tensor


def key_lists(positions: list[torch.Tensor]) -> KeyLists:
    lengths = torch.tensor([len(row) for row in positions], dtype=torch.int64)
    index = torch.cat([row.to(torch.int64) for row in positions]) if positions else torch.zeros(0, dtype=torch.int64)
    return KeyLists(lengths, torch.cumsum(lengths, 0) - lengths, index)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: list[int],
           keys: KeyLists | None = None) -> torch.Tensor | None:
    """Attention of query rows q [B, nh, T, hd] over the caches k, v [B, nkv, L, hd] (views of
    one layout; grouped-query heads: head h reads kv head h // (nh / nkv)). Row t of sequence b
    (flat index b * T + t) sees keys 0 .. counts[i] - 1, or with keys, the cache positions
    keys gives row i (in cache order); a count of 0 gives zeros. Out [B, nh, T, hd] in q's dtype
    (float32 or bfloat16); None where the kernels do not apply."""
    lib = load()
    name = CACHE_KERNELS.get(k.dtype)
    if (lib is None or name is None or k.device.type != "cpu" or v.dtype != k.dtype or k.stride(3) != 1
            or q.dtype not in IO_DTYPES):
        return None
    if v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    B, nh, T, hd = q.shape
    rows = torch.empty(B, T, nh, hd, dtype=torch.float32).copy_(q.transpose(1, 2))
    start = index = None
    if keys is None:
        base, count = _row_layout(B, T, k.stride(0), tuple(counts))
    else:
        base, count, start, index = _row_layout(B, T, k.stride(0), ())[0], keys.lengths, keys.start, keys.index
    out = torch.empty(B, T, nh, hd, dtype=q.dtype)
    getattr(lib, name)(rows.data_ptr(), k.data_ptr(), v.data_ptr(), base.data_ptr(), count.data_ptr(), address(start),
                       address(index), out.data_ptr(), int(q.dtype == torch.bfloat16), B * T, nh, k.shape[1], hd,
                       k.stride(2), k.stride(1), hd ** -0.5)
    return out.transpose(1, 2)
