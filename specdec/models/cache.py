"""Preallocated key/value cache. Static buffers make rollback free: a rejected draft is
forgotten by moving `length` back, and an accepted tree path is kept by copying its positions
down (`keep`)."""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch


def shared_prefix(cached: list[int], tokens: list[int], limit: int, start: int = 0, offset: int = 0) -> int:
    """How many leading tokens of `cached` equal those of `tokens` from `offset` on, at most limit;
    start: a length already known to match (prefix reuse and draft-cache syncing share this)."""
    n = start
    while n < limit and cached[n] == tokens[offset + n]:
        n += 1
    return n


def in_place(offsets: list[int]) -> int:
    """How many leading offsets keep their position (0, 1, ...): an accepted tree path along
    first children, and the root of every path, need no copy (a copy is 60 tensor ops on SmolLM2)."""
    n = 0
    while n < len(offsets) and offsets[n] == n:
        n += 1
    return n


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """torch.zeros(shape), whose pages on the CPU take memory only once written: an anonymous
    mapping of its own, zero until touched, where torch.zeros writes every page. A cache sized
    for 8,192 positions then holds only what a conversation has filled (the Qwen pair's caches:
    335 MB). calloc (numpy.zeros) did not hold to it: a block it reuses from the heap after a
    load is cleared page by page (the pair's peak was ~230 MB above, measured). Page-aligned."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)


def kv_buffers(num_layers: int, shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device | str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed key and value buffers, one of `shape` per layer."""
    return ([zeroed(shape, dtype, device) for _ in range(num_layers)],
            [zeroed(shape, dtype, device) for _ in range(num_layers)])


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", batch_size: int = 1):
        self.keys, self.values = kv_buffers(num_layers, (batch_size, num_kv_heads, max_len, head_dim), dtype, device)
        self.max_len = max_len
        self.length = 0  # positions [0, length) hold valid entries

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new entries at [length, length+T) and return the valid prefix including them.
        `length` itself advances once per forward pass, in `advance`."""
        start, n_new = self.length, k.shape[2]
        end = start + n_new
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions > capacity {self.max_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def layout(self) -> tuple[list[torch.Tensor], list[torch.Tensor], int] | None:
        """The per-layer buffers and where the sequence starts in them (elements), for kernels
        that write the cache themselves; None for a cache of several sequences."""
        return (self.keys, self.values, 0) if self.keys[0].shape[0] == 1 else None

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} (cache holds {self.length})")
        self.length = length

    def keep(self, start: int, offsets: list[int] | torch.Tensor) -> None:
        """Keep only positions start+offsets (in that order) among those written after `start`,
        packed contiguously from `start`; used to keep an accepted tree path."""
        offsets = [int(o) for o in offsets]
        placed = in_place(offsets)
        if placed < len(offsets):
            idx = torch.tensor(offsets[placed:], dtype=torch.long, device=self.keys[0].device) + start
            for buf in (*self.keys, *self.values):
                buf[:, :, start + placed:start + len(offsets)] = buf[:, :, idx]
        self.length = start + len(offsets)


class BatchKVCache:
    """B slots, each one sequence's cache with its own length, for batched passes (continuous
    batching). One buffer per layer, [B, heads, max_len, head_dim], so that a pass over slots
    [0, n) reads a view, never a copy: the batched engine keeps its running sequences in the
    first slots (`move` fills a freed slot). Rollback of a slot is moving its length back."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", batch_size: int = 1):
        self.keys, self.values = kv_buffers(num_layers, (batch_size, num_kv_heads, max_len, head_dim), dtype, device)
        self.max_len = max_len
        self.batch_size = batch_size
        self.lengths = [0] * batch_size  # slot b holds valid entries at [0, lengths[b])
        self._pass: tuple | None = None  # (slots, index tensors, key count) set by begin_pass

    def begin_pass(self, n_new: list[int]) -> int:
        """Prepare a pass over slots [0, len(n_new)) writing n_new[b] entries after each slot's
        length (0: the slot only pads); returns the number of key positions the pass sees."""
        n = len(n_new)
        ends = [self.lengths[b] + k for b, k in enumerate(n_new)]
        if max(ends) > self.max_len:
            raise ValueError(f"KV cache overflow: {max(ends)} positions > capacity {self.max_len}")
        slot = [b for b, k in enumerate(n_new) for _ in range(k)]
        row = [t for k in n_new for t in range(k)]
        pos = [self.lengths[b] + t for b, t in zip(slot, row)]
        device = self.keys[0].device
        index = tuple(torch.tensor(x, dtype=torch.long, device=device) for x in (slot, row, pos))
        self._pass = (n, index, max(ends))
        return max(ends)

    def pass_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pass's new entries, slot by slot: their slots, rows within the slot and positions."""
        return self._pass[1]

    def update_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the pass's new entries k, v [entries, heads, head_dim] (in pass_rows order) and
        return the keys/values of slots [0, n) up to the pass's last position."""
        n, (slot, _, pos), end = self._pass
        self.keys[layer][slot, :, pos] = k
        self.values[layer][slot, :, pos] = v
        return self.keys[layer][:n, :, :end], self.values[layer][:n, :, :end]

    def end_pass(self, n_new: list[int]) -> None:
        for b, k in enumerate(n_new):
            self.lengths[b] += k
        self._pass = None

    def rollback(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot roll slot {slot} back to {length} (it holds {self.lengths[slot]})")
        self.lengths[slot] = length

    def keep(self, slot: int, start: int, offsets: list[int] | torch.Tensor) -> None:
        """KVCache.keep for one slot: its positions start+offsets, in that order, packed from start."""
        offsets = [int(o) for o in offsets]
        n = len(offsets)
        if start + n > self.lengths[slot] or (n and start + max(offsets) >= self.lengths[slot]):
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions; cannot keep "
                             f"{[start + o for o in offsets]}")
        placed = in_place(offsets)
        if placed < n:
            idx = torch.tensor(offsets[placed:], dtype=torch.long, device=self.keys[0].device) + start
            for buf in (*self.keys, *self.values):
                buf[slot, :, start + placed:start + n] = buf[slot, :, idx]
        self.lengths[slot] = start + n

    def move(self, src: int, dst: int) -> None:
        """Copy slot src's entries into slot dst (which is overwritten) and empty src."""
        n = self.lengths[src]
        for buf in (*self.keys, *self.values):
            buf[dst, :, :n] = buf[src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def slot(self, b: int) -> SlotCache:
        return SlotCache(self, b)


class SlotCache:
    """One slot of a BatchKVCache behind KVCache's interface, so a single-sequence pass (a
    prompt's prefill chunk) runs the unchanged single-sequence model code on that slot."""

    def __init__(self, batch: BatchKVCache, b: int):
        self.batch, self.b = batch, b
        self.max_len = batch.max_len

    @property
    def length(self) -> int:
        return self.batch.lengths[self.b]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, b = self.length, self.b
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions > capacity {self.max_len}")
        keys, values = self.batch.keys[layer], self.batch.values[layer]
        keys[b:b + 1, :, start:end] = k
        values[b:b + 1, :, start:end] = v
        return keys[b:b + 1, :, :end], values[b:b + 1, :, :end]

    def layout(self) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        return self.batch.keys, self.batch.values, self.b * self.batch.keys[0].stride(0)

    def advance(self, n: int) -> None:
        self.batch.lengths[self.b] += n

    def rollback(self, length: int) -> None:
        self.batch.rollback(self.b, length)


@dataclass
class PassPlan:
    """One pass over slots [0, n) of a runner (BatchRunner.forward, OneSlotRunner.forward):
    per slot the tokens appended to it, whether its rows are exact (each computed as a 1-token
    pass would), and its tree (bool [T, T], verify.tree_attention_mask; None: a chain)."""
    rows: list[list[int]]
    exact: list[bool] | None = None
    trees: list[torch.Tensor | None] | None = None
    want_hidden: bool = True  # the final hidden states of every row (runner.last_hidden)


class PassAttention:
    """A pass whose rows attend over more than one sequence's cache (a batch's slots), handed to
    the model's layers in place of a cache: update writes the pass's keys and values, attend
    computes its queries' attention (models/batch.py BatchPass)."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
