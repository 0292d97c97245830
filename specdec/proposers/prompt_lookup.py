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
        are penalised); under a grammar the proposal is cut before the first token the
        grammar refuses, which the constrained target could never accept."""
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= n:
                continue
            pattern = ctx[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                follow = ctx[start:start + k].tolist()
                if history is not None and history.grammar is not None:
                    follow = follow[:history.grammar.valid_prefix(follow)]
                if follow:
                    return Proposal(follow, None)
        return Proposal([], None)

    def observe_target(self, hidden: torch.Tensor, prefill: bool = False) -> None:
        pass
