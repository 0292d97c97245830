"""The sequences of a batch and how much each may draft in a step (engine/batch_drafting.py decides
how much each does draft): a BatchEntry per slot, each one's limit from its method, its tokens
left and the rows a pass may hold, and whether every forked one would draft a single node (which
a batch's EAGLE forks read together: spec/proposers/batch_eagle.py)."""
from __future__ import annotations

from dataclasses import dataclass

from specdec.engine.sequence import Sequence
from specdec.models.batch import BatchRunner
from specdec.spec.proposers.base import Proposer

TREE_METHODS = ("medusa", "eagle")


@dataclass
class BatchEntry:
    """A sequence in a slot of the batch."""
    seq: Sequence
    method: str
    proposer: Proposer | None  # ngram's (shared), a fork of the decoder's own; None: none, the batched draft model
    forked: bool = False  # proposer is this sequence's own (a tree method, a draft with another tokenizer)
    prefilled: int = 0  # tokens of prompt_ids[:-1] already in the slot's cache

    @property
    def needs_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden

    @property
    def tree(self) -> bool:
        return self.method in TREE_METHODS

    @property
    def ready(self) -> bool:
        """Prefilled: the slot holds the whole context but its last token."""
        return self.prefilled >= len(self.seq.prompt_ids) - 1


def draft_limits(entries: list[BatchEntry], ready: list[int], runner: BatchRunner, cap: int, max_k: int) -> list[int]:
    """The most drafts (a tree: nodes) each ready sequence may take this step: its method's and
    its tokens' limits, max_k, and cap (max_rows // n - 1, so that the padded pass holds at most
    max_rows rows). A tree method's sequence drafts once the target has given it features; a
    drafter whose proposals may hold up to tree_floor nodes drafts one token where those do not fit."""
    limits = []
    for slot in ready:
        entry = entries[slot]
        seq = entry.seq
        room = runner.max_len - len(seq.context)
        if entry.method == "none" or (entry.tree and runner.length(slot) == 0):
            limits.append(0)
        elif entry.tree:  # a proposal may hold up to tree_floor nodes whatever its budget
            limit = max(0, min(room - 1, cap))
            limits.append(limit if limit >= entry.proposer.tree_floor else min(limit, 1))
        else:  # a chain with the lookup chain grafted may hold up to tree_floor nodes too
            fits = max(0, min(seq.remaining - 1, room - 1, cap))
            limit = min(max_k, fits)
            limits.append(limit if fits >= getattr(entry.proposer, "tree_floor", 0) else min(limit, 1))
    return limits


def reads_with_others(seq: Sequence) -> bool:
    """Whether an EAGLE fork's one-node draft for seq may be read with other forks' (greedy, no
    penalties or grammar: a tree's rows carry those)."""
    return seq.params.greedy and seq.history is None


def one_node_each(entries: list[BatchEntry], ready: list[int], limits: list[int]) -> bool:
    """Whether two or more forked sequences may draft and each would draft one node that EAGLE's
    batch reads with the others (a limit of one, reads_with_others)."""
    forked = [(entries[slot].seq, lim) for slot, lim in zip(ready, limits) if entries[slot].forked and lim]
    return len(forked) > 1 and all(lim == 1 and reads_with_others(seq) for seq, lim in forked)
