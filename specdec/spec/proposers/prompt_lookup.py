"""Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the context's
last n tokens and propose what followed it. No model; the proposal is a point mass."""
from __future__ import annotations

import torch

from specdec.sampling import SamplingParams
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.trees import chain_with_lookup

MAX_INDEXES = 64  # sequences whose n-gram index is kept
# A greedy draft of budget k (eagle's tree, a draft model's chain) also holds the lookup chain's
# first max(k - 1, LOOKUP_TOKENS) tokens, so it holds at most max(k, LOOKUP_TOKENS + 1) nodes
# (measured on SmolLM2's held-out code, bf16, eagle with chains of at most k - 1 against at most
# max(k - 1, 4) tokens: 1.22x against 1.51-1.55x plain decoding)
LOOKUP_TOKENS = 4
# a draft's guesses (Guesser): each place's kept share starts from GUESS_PRIOR_KEPT worth GUESS_PRIOR
# guesses and forgets at GUESS_DECAY a guess (how often code copies its prompt changes with the text)
GUESS_PRIOR, GUESS_PRIOR_KEPT, GUESS_DECAY = 4.0, 0.5, 0.98


class NgramIndex:
    """The most recent start of every n-gram of a growing token list that ends before its last
    token, updated as tokens are appended: a step's lookup is a few dict probes instead of a
    scan of the whole context (measured: the scan cost ~0.2 ms a step at 300-500 tokens, 8% of
    a bundled-target pass, paid even on steps where nothing matches)."""

    def __init__(self, sizes: range):
        self.tokens: list[int] = []
        self.starts: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}

    def extend(self, context: list[int]) -> None:
        old = len(self.tokens)
        self.tokens.extend(context[old:])
        end = len(self.tokens)
        for n, table in self.starts.items():
            for i in range(max(0, old - n), end - n):  # n-grams that now end before the last token
                table[tuple(self.tokens[i:i + n])] = i


class Guesser:
    """A draft model's guesses of its next tokens: up to `tokens` that followed the latest earlier
    occurrence in a context of the longest n-gram (at most `ngram` tokens) ending the context
    and the drafts after it. The draft checks them in the pass that drafts its next token,
    keeping those it drafts itself: up to n + 1 drafts a pass where code copies its prompt,
    the same drafts either way (DraftModelProposer, BatchDraftModel).

    With the draft's pass times by width (pass_seconds, calibrated at load) a pass carries only
    the guesses worth their rows: the j-th, where the first j are kept often enough to repay
    what its row adds to the pass (each kept guess saves a draft pass). On an AMD EPYC Zen 3 a
    4-bit 0.5B draft's 3- and 4-row passes cost 1.5x and 2.1x a 1-row one (AVX2, no VNNI), and
    up to four guesses a pass left the Qwen pair's `draft` at 0.87-1.04x plain where two gave
    1.06-1.19x (stop 80)."""

    def __init__(self, ngram: int = 3, tokens: int = 4):
        self.ngram, self.tokens = ngram, tokens
        self.index = NgramIndex(range(1, ngram + 1))
        self.pass_seconds: dict[int, float] | None = None  # the draft's pass by width; None: every guess
        self.checked = [0.0] * tokens  # guesses checked at each place of a pass's run (decayed)
        self.kept = [0.0] * tokens  # of them kept: the draft drew the guessed token

    def follow(self, context: list[int]) -> None:
        """Index the context a draft goes on from (once a drafting step; another text afresh)."""
        if self.index.tokens != context[:len(self.index.tokens)]:
            self.index = NgramIndex(range(1, self.ngram + 1))
        self.index.extend(context)

    def guess(self, drafted: list[int], n: int) -> list[int]:
        """At most n guesses (and `tokens`, and those worth their rows) after the followed
        context + drafted."""
        n = min(n, self.worth())
        if n <= 0:
            return []
        tail = (self.index.tokens[-self.ngram:] + drafted)[-self.ngram:]
        for size in range(min(self.ngram, len(tail)), 0, -1):
            start = self.index.starts[size].get(tuple(tail[-size:]))
            if start is not None:
                return self.index.tokens[start + size:start + size + min(n, self.tokens)]
        return []

    def worth(self) -> int:
        """How many guesses a pass may carry: up to the first j whose row (pass_seconds[j + 1] -
        pass_seconds[j]) costs more than the draft pass it saves times the chance that the
        first j guesses are all kept (each place's kept share, a few guesses' worth of prior)."""
        if not self.pass_seconds:
            return self.tokens
        chance, worth = 1.0, 0
        for j in range(1, self.tokens + 1):
            if j not in self.pass_seconds or j + 1 not in self.pass_seconds:
                break
            chance *= (self.kept[j - 1] + GUESS_PRIOR * GUESS_PRIOR_KEPT) / (self.checked[j - 1] + GUESS_PRIOR)
            if chance * self.pass_seconds[1] < self.pass_seconds[j + 1] - self.pass_seconds[j]:
                break
            worth = j
        return worth

    def observe(self, checked: int, kept: int) -> None:
        """A pass checked its first `checked` guesses and kept the first `kept` of them."""
        for i in range(checked):
            self.checked[i] = GUESS_DECAY * self.checked[i] + 1
            self.kept[i] = GUESS_DECAY * self.kept[i] + (i < kept)


class PromptLookupProposer:
    name = "ngram"
    shape = "chain"
    needs_hidden = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._indexes: dict[int, NgramIndex] = {}  # by id() of the sequence's context list

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
        follow = self._lookup(context, k)
        if grammar is not None:  # cut at the first refused token, then add what the grammar forces
            follow = follow[:grammar.valid_prefix(follow)]
            if not (follow and follow[-1] in grammar.eos_ids):
                follow += grammar.forced(follow, k - len(follow))
        return Proposal(follow, None)

    def _lookup(self, context: list[int], k: int) -> list[int]:
        """What followed the most recent earlier occurrence of the longest matching n-gram."""
        index = self._index_for(context)
        tokens = index.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(tokens) <= n:
                continue
            start = index.starts[n].get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start + n:start + n + k]
        return []

    def _index_for(self, context: list[int]) -> NgramIndex:
        """The index of this context, grown by the tokens appended since the last step (one
        per sequence: the batched engine shares this proposer between its sequences)."""
        index = self._indexes.get(id(context))
        if index is None or context[:len(index.tokens)] != index.tokens:
            if len(self._indexes) >= MAX_INDEXES:
                self._indexes.pop(next(iter(self._indexes)))
            index = self._indexes[id(context)] = NgramIndex(range(self.min_ngram, self.max_ngram + 1))
        index.extend(context)
        return index

    def observe_target(self, hidden: torch.Tensor) -> None:
        pass


def with_lookup_chain(proposal: Proposal, lookup: PromptLookupProposer, context: list[int], k: int,
                      params: SamplingParams, history: TokenHistory | None = None) -> Proposal:
    """A chain drafter's greedy proposal of budget k with what followed the context's last
    n-gram earlier grafted from the root and kept first (a tree where the two differ): code
    copies its prompt, which a draft model predicts worse than a lookup. Point masses only:
    greedy verification keeps the target's argmax whatever the candidates."""
    if not params.greedy or k < 2 or proposal.draft_probs is not None:
        return proposal
    chain = lookup.propose(context, max(k - 1, LOOKUP_TOKENS), params, None, history).tokens
    tokens, parents = chain_with_lookup(proposal.tokens, chain, k)
    return Proposal(tokens, None, parents, sync_seconds=proposal.sync_seconds)
