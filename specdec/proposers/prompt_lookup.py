"""Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the context's
last n tokens and propose what followed it. No model; the proposal is a point mass."""
from __future__ import annotations

import numpy as np
import torch

from specdec.penalties import TokenHistory
from specdec.proposers.base import Proposal
from specdec.sampling import SamplingParams
from specdec.seeded import PositionNoise


class PromptLookupProposer:
    name = "ngram"
    shape = "chain"
    needs_hidden = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def memory_bytes(self) -> int:
        return 0

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None) -> Proposal:
        """The proposal is a point mass, so penalties need nothing here (only the target's rows
        are penalised). Under a grammar the proposal is cut before the first token the grammar
        refuses (the constrained target could never accept it) and continued with the tokens
        the grammar forces (which it always accepts); any point-mass proposal is lossless."""
        grammar = history.grammar if history is not None else None
        follow = self._lookup(np.asarray(context, dtype=np.int64), k)
        if grammar is not None:  # cut at the first refused token, then add what the grammar forces
            follow = follow[:grammar.valid_prefix(follow)]
            if not (follow and follow[-1] in grammar.eos_ids):
                follow += grammar.forced(follow, k - len(follow))
        return Proposal(follow, None)

    def _lookup(self, ctx: np.ndarray, k: int) -> list[int]:
        """What followed the most recent earlier occurrence of the longest matching n-gram."""
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= n:
                continue
            pattern = ctx[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                follow = ctx[start:start + k].tolist()
                if follow:
                    return follow
        return []

    def observe_target(self, hidden: torch.Tensor, prefill: bool = False) -> None:
        pass
