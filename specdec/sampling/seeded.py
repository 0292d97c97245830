"""Seeded sampling that every method reproduces token for token (drafter-invariant speculative
decoding, Daliri, Musco and Suresh 2024, arXiv 2408.07978).

With a seed, the token at position t is a deterministic function of (seed, t, p_t), p_t the
target's final distribution there: an exponential race, token = argmax_i p_t(i) / E_t(i) with
E_t(i) ~ Exp(1) drawn from a generator keyed by (seed, t). Token i wins with probability
exactly p_t(i) (the Gumbel-max trick written with exponentials), and races at different
positions use independent noise, so over seeds the output has the target's distribution.

Plain decoding samples this way too; a verifier accepts a drafted token iff it equals the
target's race winner at that position (verify.verify_choices), so the output does not depend
on the drafter or on K at all. Drafters race their own distribution q_t with the same E_t:
the winners agree with probability >= (1 - TV) / (1 + TV), a little below rejection
sampling's 1 - TV, which is the price of reproducibility."""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch


class PositionNoise:
    """Exp(1) noise per (seed, position) over a vocabulary, cached for the positions in use."""

    def __init__(self, seed: int, vocab_size: int, cache_positions: int = 128):
        self.seed = seed
        self.vocab_size = vocab_size
        self.cache_positions = cache_positions
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()

    def exponentials(self, position: int) -> torch.Tensor:
        """[vocab_size] float64 Exp(1) variates for this position (the same on every call)."""
        noise = self._cache.get(position)
        if noise is None:
            key = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
            uniform = torch.rand(self.vocab_size, generator=generator, dtype=torch.float64)
            noise = -uniform.clamp_min(torch.finfo(torch.float64).tiny).log()
            self._cache[position] = noise
            if len(self._cache) > self.cache_positions:
                self._cache.popitem(last=False)
        return noise

    def rows(self, positions: list[int]) -> torch.Tensor:
        """[len(positions), vocab_size] noise, one row per position."""
        return torch.stack([self.exponentials(p) for p in positions])

    def samples(self, probs: torch.Tensor, positions: list[int]) -> list[int]:
        """Race winner of each row of probs [R, V] at its position (rows may share positions)."""
        return race(probs, self.rows(positions)).tolist()


def race(probs: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of p / E: a sample of p when E ~ Exp(1). Zero-probability
    tokens never win (p / E = 0 against a positive score; a row always has mass)."""
    return (probs.to(torch.float64) / exponentials[..., :probs.shape[-1]]).argmax(-1)
