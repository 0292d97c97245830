"""Grouped weights: int8 values q [N, K] and, per group of G inputs, a float32 scale and, for the
formats that have one, a float32 offset (w = q * scale + offset), in the layouts this machine's
grouped kernels read (kernels/rows.cpp: row-major, or the columns layout with Q6_K's values packed
to 6 bits), and weights rounded to 4 bits in that form (a draft's, group_quant's). GGUF's blocks
are decoded into it by gguf_blocks.py."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.kernels.build import kernels_in_use
from specdec.kernels.invariant import super_width


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

    @property
    def four_bit_one_level(self) -> bool:
        """Q4_1's shape (and `--quantize int4` where K is not a multiple of 128): 4-bit values in
        groups of 32, a float32 scale and offset a group."""
        return (self.bits == 4 and self.group == 32 and self.scale_super is None and self.offset is not None
                and self.scale.dtype == torch.float32)

    @property
    def signed_bytes(self) -> bool:
        """Q8_0's shape (`--quantize int8`): signed values a byte, groups of 32, a float32 scale a
        group, no offsets."""
        return (self.bits == 8 and self.group == 32 and self.q.dtype == torch.int8 and self.scale_super is None
                and self.offset is None)

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
    "avx2-columns" and g is a format that kernel reads (4-bit values in groups of 32, one level or
    a K-quant's two, or Q6_K's); else g. Q6_K's values packed to 6 bits there (a 1-token pass reads 3/4 of their
    bytes: Qwen2.5-Coder-1.5B's output head and half its down projections), AMX tiles' wide
    passes included."""
    N, K = g.shape
    kernel = kernels_in_use().get("grouped")
    if g.columns or N % 16 or K % 32 or kernel not in ("vnni", "avx2-columns"):
        return g
    if kernel == "avx2-columns" and not (g.six_bit_packable or g.four_bit_superblocks or g.four_bit_one_level
                                        or g.signed_bytes):
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
