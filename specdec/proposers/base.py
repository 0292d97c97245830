"""The interface every drafter implements."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.sampling import SamplingParams


@dataclass
class Proposal:
    tokens: list[int]
    draft_probs: torch.Tensor | None  # [len(tokens), V] final draft distributions, or None = point mass


class Proposer(Protocol):
    name: str
    cost_per_token_matters: bool  # False when drafting is practically free (prompt lookup)

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new sequence."""

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Up to k tokens that may follow context (fewer, even none, when it has no idea)."""

    def accepted(self, num_drafted: int, num_accepted: int) -> None:
        """Learn from the verdict on the last proposal."""
