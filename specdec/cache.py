"""Preallocated key/value cache. Static buffers make rollback free: a rejected draft is
forgotten by moving `length` back, and an accepted tree path is kept by copying its positions
down (`keep`)."""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", batch_size: int = 1):
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
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

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} (cache holds {self.length})")
        self.length = length

    def keep(self, start: int, offsets: list[int] | torch.Tensor) -> None:
        """Keep only positions start+offsets (in that order) among those written after `start`,
        packed contiguously from `start`; used to keep an accepted tree path."""
        idx = torch.as_tensor(offsets, dtype=torch.long, device=self.keys[0].device) + start
        n = idx.numel()
        for buf in (*self.keys, *self.values):
            buf[:, :, start:start + n] = buf[:, :, idx]
        self.length = start + n
