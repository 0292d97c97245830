"""Verification of drafted tokens, as pure functions of probabilities (no models).

Notation: `target_probs[i]` is the target's final distribution for the token after the
context plus the first i drafted tokens (one more row than there are drafts);
`draft_probs[i]` is the distribution `draft_tokens[i]` was sampled from, or None for a
deterministic proposer (a point mass, q(x) = 1).

Randomness goes through a small `RandomSource` (coin flips and categorical draws) so tests
can enumerate every outcome of the real code with its exact probability."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class RandomSource(Protocol):
    def coin(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


class TorchRandom:
    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def coin(self, prob: float) -> bool:
        return torch.rand((), generator=self.generator, dtype=torch.float64).item() < prob

    def categorical(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))


@dataclass
class ChainVerdict:
    num_accepted: int  # drafted tokens kept
    next_token: int  # the target's own token after them (correction or bonus)


def verify_greedy(draft_tokens: list[int], target_probs: torch.Tensor) -> ChainVerdict:
    """Keep the longest prefix equal to the target's argmax, then the target's argmax."""
    target_choice = target_probs.argmax(-1).tolist()
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
        n += 1
    return ChainVerdict(n, target_choice[n])


def residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)); falls back to p when rounding leaves no mass."""
    residual = (target_row - draft_row).clamp_min(0)
    total = residual.sum()
    return residual / total if total > 0 else target_row


def point_mass(token: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def verify_rejection(draft_tokens: list[int], draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor, rng: RandomSource) -> ChainVerdict:
    """Leviathan/Chen rejection sampling: the output has exactly the target's distribution."""
    for i, x in enumerate(draft_tokens):
        p = float(target_probs[i, x])
        q = float(draft_probs[i, x]) if draft_probs is not None else 1.0
        if p >= q or rng.coin(p / q):  # accept with probability min(1, p/q)
            continue
        draft_row = draft_probs[i] if draft_probs is not None else point_mass(x, target_probs[i])
        return ChainVerdict(i, rng.categorical(residual_distribution(target_probs[i], draft_row)))
    k = len(draft_tokens)
    return ChainVerdict(k, rng.categorical(target_probs[k]))
