"""A reduced draft vocabulary (EAGLE-3's d2t map, FR-Spec): a draft head predicts over the N
most frequent tokens of its training data instead of the target's whole vocabulary, because
the output projection is the head's largest cost (SmolLM2's 49,152 x 576 lm_head is a fifth of
the target's weights). Verification stays exact: the draft distribution is the head's softmax
over its N tokens and zero elsewhere, which rejection sampling accepts like any other q (a
token the draft cannot propose is still emitted through the residual max(p - q, 0))."""
from __future__ import annotations

import torch


def frequent_tokens(counts: torch.Tensor, n: int) -> torch.Tensor:
    """d2t: the ids of the n most frequent tokens (ties: the lower id), in ascending id order."""
    n = min(n, len(counts))
    order = torch.argsort(-counts.double() + torch.arange(len(counts)) * 1e-9 / len(counts), stable=True)
    return order[:n].sort().values


def coverage(counts: torch.Tensor, d2t: torch.Tensor) -> float:
    """Share of the counted tokens that the draft vocabulary holds."""
    total = counts.sum().item()
    return counts[d2t].sum().item() / total if total else 0.0


def expand_logits(draft_logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int,
                  outside: float = float("-inf")) -> torch.Tensor:
    """[..., N] values over the draft vocabulary -> [..., vocab_size] by target id, `outside`
    elsewhere: logits get -inf (so every sampling filter, penalty and mask works on target ids
    unchanged), probabilities 0."""
    full = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), outside)
    full[..., d2t] = draft_logits
    return full
