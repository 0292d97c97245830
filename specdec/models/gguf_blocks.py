"""GGUF's quantized blocks unpacked into one layout the kernels read (kernels/rows.cpp,
linear_q8g): int8 values q [N, K], and per group of G inputs a float32 scale and, for the
formats that have one, a float32 offset: w = q * scale + offset. Every format below fits it
exactly (the scale d * sc and the offset -dmin * m are products of a float16 and a 6-bit
integer, exact in float32), so a weight is the value llama.cpp's own dequantization gives,
at one byte per weight plus 4-8 bytes per group instead of a float copy.

Block layouts follow ggml's (ggml-common.h / ggml-quants.c); this is an independent numpy
rewrite, checked against the `gguf` package's dequantization in tests/test_gguf_blocks.py."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.kernels.build import kernels_in_use
from specdec.kernels.invariant import super_width

# format: (values per block, bytes per block)
BLOCK_SIZES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
               "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
GROUPED_FORMATS = tuple(BLOCK_SIZES)
# values of at most 4 bits: stored two a byte (half the bytes a pass reads)
FOUR_BIT_FORMATS = ("Q4_0", "Q4_1", "Q4_K")
SHIFTS = {"Q4_0": 8, "Q5_0": 16, "Q6_K": 32}  # signed values stored unsigned (the kernel's u8 x s8 products)


@dataclass
class Grouped:
    """w[n, k] = q[n, k] * scale[n, k // group] (+ offset[n, k // group]). q is unsigned, uint8
    [N, K] (bits 8) or [N, K / 2] holding 4-bit values (bits 4: in each group of 32, byte j holds
    value j in its low nibble and value j + 16 in its high one, the kernel's layout, rows.cpp);
    or int8 [N, K] without offsets (Q8_0). Signed formats are stored shifted, their offset
    taking the shift back: (q + 16) * d - 16 * d, both products exact in float32. The K-quants
    keep their two levels of scales: scale and offset int8 [N, K / group] times scale_super and
    offset_super float32 [N, K / S] for superblocks of S = super_width(K) inputs (Q6_K's offset
    is its scale times -32 * d: the same int8 tensor)."""
    q: torch.Tensor
    scale: torch.Tensor  # float32 [N, K / group], or int8 with scale_super
    offset: torch.Tensor | None  # float32 [N, K / group], or int8 with offset_super
    group: int
    bits: int = 8
    scale_super: torch.Tensor | None = None
    offset_super: torch.Tensor | None = None
    columns: bool = False  # q in the columns layout (in_columns), else row-major

    def group_scales(self, rows: torch.Tensor | slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Float32 scale and offset per group of the given rows."""
        def level(t, sup):
            if t is None or sup is None:
                return None if t is None else self.row_major(t, rows)
            return self.row_major(t, rows).to(torch.float32) * self.row_major(sup, rows).repeat_interleave(
                super_width(self.shape[1]) // self.group, dim=-1)
        return level(self.scale, self.scale_super), level(self.offset, self.offset_super)

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * 8 // self.bits

    def values(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """The integer values q of the given rows, [rows, K] int16."""
        q = self.row_major_q(rows)
        if self.bits in (6, 8):  # 6: unpacked to a byte a value by row_major_q
            return q.to(torch.int16)
        halves = q.reshape(*q.shape[:-1], -1, 16).to(torch.int16)
        return torch.cat([halves & 15, halves >> 4], -1).reshape(*q.shape[:-1], -1)

    def dequantized(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """Float32 weights of the given rows (all by default)."""
        scale, offset = self.group_scales(rows)
        w = self.values(rows).to(torch.float32) * scale.repeat_interleave(self.group, dim=-1)
        return w if offset is None else w + offset.repeat_interleave(self.group, dim=-1)

    def _runs(self) -> tuple[int, int, int]:
        """q's [N, B] bytes as groups of GB bytes a row, in runs of 4: (B // GB, GB // 4, 4)."""
        GB = self.group // 2 if self.bits == 4 else self.group
        return self.q.shape[1] // GB, GB // 4, 4

    @property
    def six_bit_packable(self) -> bool:
        """Q6_K's shape: unsigned values a byte (below 64, in_columns checks), groups of 16, two levels
        of scales with offsets, K a multiple of 256 (rows.cpp's 6-bit path)."""
        return (self.bits == 8 and self.group == 16 and self.q.dtype == torch.uint8 and self.scale_super is not None
                and self.offset is not None and self.shape[1] % 256 == 0)

    @property
    def four_bit_superblocks(self) -> bool:
        """Q4_K's shape (and a draft's 4-bit rounding): 4-bit values in groups of 32, two levels of
        scales with offsets."""
        return (self.bits == 4 and self.group == 32 and self.scale_super is not None and self.offset is not None
                and self.offset_super is not None)

    def in_columns(self, six: bool = False) -> Grouped:
        """A copy in the columns layout rows.cpp's VNNI kernel streams (vnni_glinear): in each
        block of 16 rows, group by group, q's runs of 4 bytes of the 16 rows side by side, and
        each group's (or superblock's) 16 scales and offsets side by side. Needs N a multiple of 16.
        six (Q6_K's values, below 64): q packed to 6 bits a value (pack_six), 3/4 of the bytes."""
        N, B = self.q.shape
        if self.bits == 8 and self.group == 16 and self.scale_super is not None and int(self.q.max()) >= 64:
            # the kernel splits these scales in 2-bit parts, each product with a value a byte (rows.cpp)
            raise ValueError("byte-a-value weights in groups of 16 with two levels of scales need values below 64 "
                             "(Q6_K's)")
        q = self.q.reshape(N // 16, 16, *self._runs()).permute(0, 2, 3, 1, 4).contiguous().reshape(N, B)
        moved = {}
        for name in ("scale", "offset", "scale_super", "offset_super"):
            t = getattr(self, name)
            same = next((moved[other] for other in moved if getattr(self, other) is t), None)  # Q6_K: one tensor
            moved[name] = same if same is not None or t is None else \
                t.reshape(N // 16, 16, -1).transpose(1, 2).contiguous().reshape(t.shape)
        if six:  # values below 64: checked above for these weights
            if not self.six_bit_packable:
                raise ValueError("6-bit packing takes byte-a-value weights below 64 in groups of 16 (Q6_K's)")
            return replace(self, q=pack_six(q), bits=6, columns=True, **moved)
        return replace(self, q=q, columns=True, **moved)

    def row_major(self, t: torch.Tensor, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """The given rows of q or of a scale tensor, row-major whichever layout they are in (q
        packed to 6 bits: a byte a value)."""
        if not self.columns:
            return t[rows]
        N = t.shape[0]
        index = torch.arange(N)[rows]
        if t is self.q and self.bits == 6:  # the blocks holding these rows, unpacked to bytes
            blocks, at = torch.unique(index // 16, return_inverse=True)
            unpacked = replace(self, q=unpack_six(t.reshape(N // 16, -1)[blocks]).reshape(len(blocks) * 16, -1),
                               bits=8)
            return unpacked.row_major(unpacked.q, at * 16 + index % 16)
        if t is self.q:
            grid = t.reshape(N // 16, *self._runs()[:2], 16, 4)
            return grid[index // 16, :, :, index % 16].reshape(len(index), t.shape[1])
        return t.reshape(N // 16, -1, 16)[index // 16, :, index % 16]

    def row_major_q(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """q's given rows in the row-major layout, whichever layout q is in."""
        return self.row_major(self.q, rows)

    @property
    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.q, self.scale, self.offset, self.scale_super, self.offset_super

    @property
    def nbytes(self) -> int:
        distinct = {t.data_ptr(): t.numel() * t.element_size() for t in self.tensors if t is not None}
        return sum(distinct.values())


def for_kernels(g: Grouped) -> Grouped:
    """g in the layout this machine's grouped products read: the columns layout where the kernels
    chose VNNI for them (kernels/variants.py "grouped") and N is a multiple of 16, or chose
    "avx2-columns" and g is a K-quant's two levels that kernel reads (4-bit values in groups of 32,
    or Q6_K's); else g. Q6_K's values packed to 6 bits there (a 1-token pass reads 3/4 of their
    bytes: Qwen2.5-Coder-1.5B's output head and half its down projections), AMX tiles' wide
    passes included."""
    N, K = g.shape
    kernel = kernels_in_use().get("grouped")
    if g.columns or N % 16 or K % 32 or kernel not in ("vnni", "avx2-columns"):
        return g
    if kernel == "avx2-columns" and not (g.six_bit_packable or g.four_bit_superblocks):
        return g
    return g.in_columns(g.six_bit_packable)


def pack_six(q: torch.Tensor) -> torch.Tensor:
    """Byte-a-value columns-layout q [N, K] (values below 64, groups of 16: runs of 64 bytes, four
    a group) -> [N, 3K / 4]: each group's runs 0-3 as (r0 & 15) | (r1 & 15) << 4, the same of r2
    and r3, then r0 >> 4 | r1 >> 4 << 2 | r2 >> 4 << 4 | r3 >> 4 << 6 (rows.cpp group_runs6)."""
    N, K = q.shape
    runs = q.reshape(N // 16, K // 16, 4, 64)
    low, top = runs & 15, runs >> 4
    packed = torch.cat([low[:, :, 0] | low[:, :, 1] << 4, low[:, :, 2] | low[:, :, 3] << 4,
                        top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6], dim=-1)
    return packed.reshape(N, K * 3 // 4)


def unpack_six(packed: torch.Tensor) -> torch.Tensor:
    """pack_six's inverse on [blocks, bytes] of whole 16-row blocks: [blocks, 16 * K] bytes."""
    blocks, B = packed.shape
    groups = packed.reshape(blocks, B // 192, 3, 64)
    lo01, lo23, top = groups[:, :, 0], groups[:, :, 1], groups[:, :, 2]
    runs = torch.stack([lo01 & 15 | (top & 3) << 4, lo01 >> 4 | (top >> 2 & 3) << 4,
                        lo23 & 15 | (top >> 4 & 3) << 4, lo23 >> 4 | (top >> 6) << 4], dim=2)
    return runs.reshape(blocks, -1)


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


def four_bit(weights, N: int, K: int, rows_per_call: int = 4096) -> Grouped:
    """Weights [N, K] (weights(rows): float32 rows of a slice) rounded to 4 bits by groups of 32,
    with a scale and an offset a group in two levels where K is a multiple of 128 (int8 a group
    times float32 per superblock of super_width(K), as Q4_K: ~0.59 bytes a weight), else float32
    ones (as Q4_1 with wider scales: 0.75)."""
    if K % 32:
        raise ValueError("4-bit groups of 32 need K a multiple of 32")
    two = K % 128 == 0
    S = super_width(K)
    q = torch.empty(N, K // 2, dtype=torch.uint8)
    scale = torch.empty(N, K // 32, dtype=torch.int8 if two else torch.float32)
    offset = torch.empty_like(scale)
    scale_super, offset_super = (torch.empty(N, K // S), torch.empty(N, K // S)) if two else (None, None)
    for start in range(0, N, rows_per_call):
        rows = slice(start, min(N, start + rows_per_call))
        w = weights(rows).reshape(-1, K // 32, 32)
        low, high = w.amin(-1), w.amax(-1)  # [n, K / 32]
        d, m = (high - low) / 15, low
        if two:  # int8 factors of a float32 per superblock, the offset rounded down and the step
            # up, so that the 16 levels still span the group: every weight within half a step
            supers = (-1, K // S, S // 32)
            osup = low.reshape(supers).abs().amax(-1, keepdim=True) / 127
            of = torch.where(osup > 0, low.reshape(supers) / osup, 0).floor().clamp(-127, 127)
            m = (of * osup).reshape(low.shape)
            d = (high - m) / 15
            ssup = d.reshape(supers).amax(-1, keepdim=True) / 127
            sc = torch.where(ssup > 0, d.reshape(supers) / ssup, 0).ceil().clamp(0, 127)
            d = (sc * ssup).reshape(d.shape)
            scale[rows], offset[rows] = sc.to(torch.int8).reshape(d.shape), of.to(torch.int8).reshape(m.shape)
            scale_super[rows], offset_super[rows] = ssup[..., 0], osup[..., 0]
        else:
            scale[rows], offset[rows] = d, m
        values = torch.where(d[..., None] > 0, (w - m[..., None]) / d[..., None], 0).round().clamp(0, 15)
        halves = values.to(torch.uint8).reshape(-1, K // 32, 2, 16)
        q[rows] = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(-1, K // 2)
    return Grouped(q, scale, offset, 32, 4, scale_super, offset_super)
