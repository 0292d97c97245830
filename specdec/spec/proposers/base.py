"""The interface every drafter implements."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise


@dataclass
class Proposal:
    tokens: list[int]
    # Chain: [len(tokens), V] final draft distributions the tokens were sampled from. Tree:
    # [len(tokens) + 1, V], row 0 for the root and row 1+i for node i: the distribution the
    # node's children were drawn from. None = deterministic candidates (point masses).
    draft_probs: torch.Tensor | None = None
    # None = a chain; else a tree: parents[i] is the index of node i's parent, -1 = the root
    parents: list[int] | None = None
    # sampled trees only, rows as draft_probs: every token drawn at that node, in draw order,
    # including drawn tokens left out of the tree (all must be tried for exactness)
    draws: list[list[int]] | None = None
    # time spent feeding the drafter tokens it did not draft (after plain steps): a one-off
    # cost, kept out of the controller's per-step drafting cost
    sync_seconds: float = 0.0
    # prompt lookup's drafts standing in for a drafter held back this step (a draft model whose
    # prompt read would not be repaid): kept out of that drafter's controller
    stand_in: bool = False
    # a chain drafter given a confidence floor: its probability of all its drafts up to each
    # (what the controller calibrates against the drafts the target keeps)
    confidences: list[float] | None = None


class Proposer(Protocol):
    """A drafter. It syncs its own state (caches) from the context it is handed; what gets
    accepted is learnt by the engine's controller, which sets the budget k each step. A drafter
    that reads its context lazily may also offer upfront_seconds(context), the seconds its next
    draft would first spend reading (a draft model's prompt): a lone sequence then drafts only
    where that is repaid (engine/batch_drafting.py own_budget)."""

    name: str
    shape: str  # "chain" (budget = drafted tokens) or "tree" (budget = tree nodes)
    needs_hidden: bool  # wants the target's final hidden states (Medusa, EAGLE)
    tree_sizes: list[int]  # tree drafters only: the node budgets the controller chooses among
    # a proposal of budget k holds at most max(k, tree_floor) nodes (a tree drafter's, or a chain
    # drafter's with the prompt-lookup chain grafted: a tree where the two differ)
    tree_floor: int

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new sequence. A drafter that needs_hidden takes kept_features=n too: the
        target kept the first n positions of its cache from the last sequence (prefix reuse), so
        their features come from that sequence's (at most features_kept(), the leading positions
        it still holds; None where it reads no earlier position's feature)."""

    def fork(self) -> Proposer:
        """A proposer for another sequence at once (continuous batching): the same weights,
        its own per-sequence state (caches, features). Drafters without such state, or batched
        otherwise, may lack it."""

    def memory_bytes(self) -> int:
        """Bytes of the drafter's own weights and caches (not counting what it shares with the target)."""

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None) -> Proposal:
        """Up to k tokens (chain) or nodes (tree) that may follow context. history (when
        params.penalized): the context's token counts; a drafter that samples from a model
        adjusts each row with history.rows(its path), as the target's rows are adjusted.
        noise (seeded drafter-invariant sampling): a drafter that samples draws the token at
        position t (len(context) + depth) as the race winner with noise.exponentials(t), which
        makes it agree with the target's own seeded choice as often as possible."""

    def observe_target(self, hidden: torch.Tensor) -> None:
        """Hidden states [n, d] of the tokens just added to the target's cache, in order
        (only called when needs_hidden)."""


def read_head_config(folder: str | Path, model_type: str) -> dict:
    """config.json of a draft-head folder (Medusa, EAGLE), checked for its model_type."""
    cfg_path = Path(folder) / "config.json"
    if not cfg_path.is_file():
        raise SpecdecError(f"{str(folder)!r} is not a {model_type} folder: no config.json")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("model_type") != model_type:
        raise SpecdecError(f"{str(folder)!r} is not a {model_type} folder (model_type "
                           f"{cfg.get('model_type')!r})")
    if not (Path(folder) / "model.safetensors").is_file():
        raise SpecdecError(f"{str(folder)!r} has no model.safetensors")
    return cfg
