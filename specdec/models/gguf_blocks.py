"""GGUF's quantized blocks unpacked into the one layout the grouped kernels read (Grouped,
grouped_weights.py): int8 values q [N, K], and per group of G inputs a float32 scale and, for the
formats that have one, a float32 offset: w = q * scale + offset. Every format below fits it
exactly (the scale d * sc and the offset -dmin * m are products of a float16 and a 6-bit
integer, exact in float32), so a weight is the value llama.cpp's own dequantization gives,
at one byte per weight plus 4-8 bytes per group instead of a float copy.

Block layouts follow ggml's (ggml-common.h / ggml-quants.c); this is an independent numpy
rewrite, checked against the `gguf` package's dequantization in tests/test_gguf_blocks.py."""
from __future__ import annotations

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.models.grouped_weights import Grouped, four_bit

# format: (values per block, bytes per block)
BLOCK_SIZES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
               "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
GROUPED_FORMATS = tuple(BLOCK_SIZES)
# values of at most 4 bits: stored two a byte (half the bytes a pass reads)
FOUR_BIT_FORMATS = ("Q4_0", "Q4_1", "Q4_K")
SHIFTS = {"Q4_0": 8, "Q5_0": 16, "Q6_K": 32}  # signed values stored unsigned (the kernel's u8 x s8 products)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 from the last axis's 2 bytes, as float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qs & 0x0F, qs >> 4


def _bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit j of a little-endian uint32 for j < count: [..., count] of 0/1."""
    word = np.ascontiguousarray(qh).view("<u4")[..., 0]
    return ((word[..., None] >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a Q4_K / Q5_K block's 12 bytes."""
    s = scales.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    m = np.empty_like(sc)
    sc[..., :4], m[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    m[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, m


def _unpack(kind: str, b: np.ndarray) -> tuple:
    """b [blocks, bytes] -> q [blocks, values], scale [blocks, groups], offset or None, group,
    and for the K-quants the super-block's scale and offset factors [blocks] (their scale and
    offset then int8 sub-block factors), else None, None."""
    if kind == "Q8_0":
        return b[:, 2:].view(np.int8), _f16(b[:, 0:2])[:, None], None, 32, None, None
    if kind in ("Q4_0", "Q4_1"):
        lo, hi = _nibbles(b[:, -16:])
        q = np.concatenate([lo, hi], 1).astype(np.int8)
        if kind == "Q4_0":
            return q - 8, _f16(b[:, 0:2])[:, None], None, 32, None, None
        return q, _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None], 32, None, None
    if kind in ("Q5_0", "Q5_1"):
        start = 2 if kind == "Q5_0" else 4
        high = _bits(b[:, start:start + 4], 32) << 4
        lo, hi = _nibbles(b[:, start + 4:])
        q = (np.concatenate([lo, hi], 1) | high).astype(np.int8)
        if kind == "Q5_0":
            return q - 16, _f16(b[:, 0:2])[:, None], None, 32, None, None
        return q, _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None], 32, None, None
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, m = _k_scales(b[:, 4:16])
        qs = b[:, -128:].reshape(-1, 4, 32)  # chunk i's low nibbles: sub-block 2i, high: 2i + 1
        lo, hi = _nibbles(qs)
        q = np.stack([lo, hi], 2).reshape(-1, 8, 32)
        if kind == "Q5_K":
            qh = b[:, 16:48]  # bit j of qh[l]: sub-block j's value l
            q = q | (((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4)
        return q.reshape(-1, 256).astype(np.int8), sc.astype(np.int8), m.astype(np.int8), 32, d, -dmin
    if kind == "Q6_K":
        ql, qh = b[:, 0:128].reshape(-1, 2, 2, 32), b[:, 128:192].reshape(-1, 2, 1, 32)
        scales, d = b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
        lo, hi = _nibbles(ql)  # [blocks, half, 2, 32]: ql[l], ql[l + 32]
        shifts = np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
        high = (qh >> shifts) & 3  # [blocks, half, 4, 32]: values l, l + 32, l + 64, l + 96
        q = np.concatenate([lo, hi], 2) | (high << 4)
        return q.reshape(-1, 256).astype(np.int8) - 32, scales.astype(np.int8), None, 16, d, None
    raise SpecdecError(f"GGUF block format {kind} is not supported here (supported: {', '.join(GROUPED_FORMATS)})")


def unpack(kind: str, data: np.ndarray, shape: tuple[int, int], rows_per_call: int = 4096) -> Grouped:
    """A GGUF tensor's raw blocks (data: uint8 [N, bytes per row]) in the grouped layout,
    shape = (N, K). Unpacked a slice of rows at a time so that the temporaries stay small."""
    if kind not in BLOCK_SIZES:
        raise SpecdecError(f"GGUF block format {kind} is not supported here (supported: {', '.join(GROUPED_FORMATS)})")
    values, nbytes = BLOCK_SIZES[kind]
    N, K = shape
    if K % values or data.size != N * K // values * nbytes:
        raise SpecdecError(f"a {kind} tensor of shape {shape} needs {N * K // values * nbytes} bytes in blocks of "
                           f"{values}; it has {data.size} (truncated file?)")
    data = np.asarray(data, dtype=np.uint8).reshape(N, K // values * nbytes)
    four_bit = kind in FOUR_BIT_FORMATS
    q = torch.empty(N, K // 2 if four_bit else K, dtype=torch.int8 if kind == "Q8_0" else torch.uint8)
    two_level = kind.endswith("_K")
    fields: dict[str, torch.Tensor | None] = {}
    group = 0
    for start in range(0, N, rows_per_call):
        part = data[start:start + rows_per_call]
        n = part.shape[0]
        qb, sb, ob, group, ssup, osup = _unpack(kind, part.reshape(-1, nbytes))
        if kind in SHIFTS:  # stored unsigned, the offset taking the shift back
            qb = (qb.astype(np.int16) + SHIFTS[kind]).astype(np.uint8)
            if two_level:  # Q6_K: offset = scale * (-32 * d), the scale's own int8 factors
                ob, osup = sb, -SHIFTS[kind] * ssup
            else:
                ob = -SHIFTS[kind] * sb
        if four_bit:
            halves = qb.reshape(n, K // 32, 2, 16).astype(np.uint8)
            qb = halves[:, :, 0] | (halves[:, :, 1] << 4)
        q[start:start + n] = torch.from_numpy(np.ascontiguousarray(qb).reshape(n, -1))
        values = {"scale": sb, "offset": ob, "scale_super": ssup, "offset_super": osup}
        for name, value in values.items():
            if value is None:
                fields.setdefault(name, None)
                continue
            if name not in fields:
                dtype = torch.int8 if two_level and name in ("scale", "offset") else torch.float32
                width = K // 256 if name.endswith("super") else K // group
                fields[name] = torch.empty(N, width, dtype=dtype)
            array = np.ascontiguousarray(value, dtype=np.int8 if fields[name].dtype == torch.int8 else np.float32)
            fields[name][start:start + n] = torch.from_numpy(array.reshape(n, -1))
    if kind == "Q6_K":
        fields["offset"] = fields["scale"]  # one tensor, read for both
    return Grouped(q, fields["scale"], fields["offset"], group, 4 if four_bit else 8, fields["scale_super"],
                   fields["offset_super"])


def requantized_4bit(g: Grouped, rows_per_call: int = 4096) -> Grouped:
    """g's weights rounded to 4 bits (four_bit), for a draft model whose values are stored a byte
    each (Q5_0, Q8_0, Q6_K: 1.25 bytes a weight unpacked): its rounding only moves the draft's
    proposals, verification keeps the output exact."""
    return four_bit(g.dequantized, *g.shape, rows_per_call)
