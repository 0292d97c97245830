"""A step's verdict for one sequence from the target's logits over [last] + drafts, with the
sequence's own sampling settings: greedy, seeded races (drafter-invariant sampling) or
rejection sampling, for a chain or a tree. Shared by both decode loops, so a sequence is
verified alike alone and in a batch."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.engine.sequence import Sequence
from specdec.sampling import final_probs
from specdec.sampling.penalties import chain_paths, tree_paths
from specdec.spec.proposers.base import Proposal
from specdec.spec.verify import (
    ChainVerdict,
    TreeVerdict,
    tree_depths,
    verify_choices,
    verify_greedy,
    verify_rejection,
    verify_tree_choices,
    verify_tree_greedy,
    verify_tree_sampling,
    verify_tree_typical,
)


@dataclass
class Verified:
    """What the target's pass kept of one proposal."""
    new_tokens: list[int]  # accepted drafts + the target's own token
    num_accepted: int
    kept: list[int]  # rows of the verify pass that stay in the cache
    target_seconds: float
    logits: torch.Tensor | None = None  # the pass's logits: row kept[j] predicted new_tokens[j]


def chain_verdict(seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> ChainVerdict:
    """Verify a chain from the target's logits over [last] + drafts, with the sequence's own
    sampling settings (shared with the batched engine, so both verify alike)."""
    drafts, params, history = proposal.tokens, seq.params, seq.history
    if params.greedy and history is None:  # no penalties or grammar (penalties.history_for)
        return verify_greedy(drafts, logits)  # the argmax final_probs' one-hot would have, without building it
    target_probs = final_probs(logits, params, history and history.rows(chain_paths(drafts)))
    if params.greedy:
        return verify_greedy(drafts, target_probs)
    if seq.noise is not None:  # row i predicts the token at position len(context) + i
        positions = list(range(len(seq.context), len(seq.context) + len(drafts) + 1))
        return verify_choices(drafts, seq.noise.samples(target_probs, positions))
    return verify_rejection(drafts, proposal.draft_probs, target_probs, seq.rng)


def tree_verdict(seq: Sequence, proposal: Proposal, logits: torch.Tensor, typical: bool = False) -> TreeVerdict:
    """Verify a tree from the target's logits over [last] + nodes (node i at row 1 + i), with
    the sequence's own sampling settings (shared with the batched engine). typical: the LOSSY
    typical acceptance instead of exact tree rejection sampling (sampling only)."""
    drafts, parents, params, history = proposal.tokens, proposal.parents, seq.params, seq.history
    target_probs = final_probs(logits, params, history and history.rows(tree_paths(drafts, parents)))
    if params.greedy:
        return verify_tree_greedy(drafts, parents, target_probs)
    if seq.noise is not None:  # the row of a node at depth d predicts position len(context) + d
        positions = [len(seq.context) + d for d in [0] + tree_depths(parents)]
        return verify_tree_choices(drafts, parents, seq.noise.samples(target_probs, positions))
    if typical:
        return verify_tree_typical(drafts, parents, target_probs, seq.rng)
    return verify_tree_sampling(drafts, parents, target_probs, seq.rng, proposal.draft_probs, proposal.draws)
