"""Rotary position embeddings: the inverse frequencies a config asks for (with its scaling),
cos/sin per position (a table computed once, in float64, rounded once to the model dtype) and
their application to queries and keys."""
from __future__ import annotations

import math

import torch

from specdec.models.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: none, linear, llama3")


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [B or 1, 1, T, head_dim] for the given positions ([T] or [B, T])."""
    freqs = positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    if emb.dim() == 2:
        emb = emb[None]
    emb = emb[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RopeTable:
    """cos/sin rows looked up by position from a table grown on demand, so a decode step
    indexes instead of computing. The table is float64-exact, rounded once to the model dtype.
    The sine table is stored with its first half negated (see apply_rope)."""

    def __init__(self, inv_freq: torch.Tensor):
        self.inv_freq = inv_freq  # float64, outside any module's buffers: .to(dtype) must not round it
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [B or 1, T, 1, head_dim] for positions [T] or [B, T]: they
        broadcast over the heads of [B, T, heads, head_dim]."""
        self.tables(int(positions.max()) + 1, dtype, device)
        cos, sin = self.cos[positions], self.sin[positions]
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        return cos[:, :, None], sin[:, :, None]

    def tables(self, need: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cos and signed sin tables [positions, head_dim], covering positions [0, need)."""
        if self.cos is None or self.cos.shape[0] < need or self.cos.dtype != dtype or self.cos.device != device:
            size = max(256, 1 << (need - 1).bit_length())
            cos, sin = rope_cos_sin(torch.arange(size), self.inv_freq, dtype)
            sin = sin[0, 0]
            half = sin.shape[-1] // 2
            self.cos, self.sin = cos[0, 0].to(device), torch.cat([-sin[:, :half], sin[:, half:]], -1).to(device)
        return self.cos, self.sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x [B, T, heads, head_dim], with rotate_half(x) =
    cat(-x2, x1) taken as x.roll(half) times a sine whose first half is negated: negation is
    exact, so the bits are those of the textbook form, in fewer ops (a decode step runs this
    for every layer)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin
