"""The draft model of a batched engine: one KV-cache slot per sequence (the target's slot
numbers) and ONE batched draft pass per draft position for all the sequences drafting in a
step, instead of one pass per sequence and position. Each slot syncs with its sequence's
context lazily, as DraftModelProposer does, and each sequence draws its drafts with its own
sampling settings (greedy argmax, rejection sampling's draws, or seeded races)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.models.batch import BatchRunner
from specdec.models.cache import PassPlan
from specdec.models.llama import LlamaModel
from specdec.sampling import SamplingParams, final_probs, greedy_token, sample
from specdec.sampling.penalties import TokenHistory, adjust_logits
from specdec.sampling.seeded import PositionNoise, race
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.prompt_lookup import Guesser

# a batched draft pass's rows, its sequences' prompt-lookup guesses included: a wider pass no longer
# costs what a one-row pass does (bf16 products compute-bound from ~8 rows, bench/results "stop 61")
GUESS_ROWS = 8


@dataclass
class DraftRequest:
    """One sequence's share of a batched drafting step."""
    slot: int
    context: list[int]
    k: int
    params: SamplingParams
    generator: torch.Generator | None
    history: TokenHistory | None = None
    noise: PositionNoise | None = None


def draw(logits: torch.Tensor, request: DraftRequest, tokens: list[int], position: int, confidence: bool = False
         ) -> tuple[int, torch.Tensor | None, float | None]:
    """The next draft from the draft model's logits [V] after `tokens` drafted so far (a lone
    DraftModelProposer's and a batch's alike), with the distribution it was drawn from (None:
    greedy) and, if asked, the draft's probability of it (greedy: under its row's softmax)."""
    params, history = request.params, request.history
    penalty_row = history.rows([tokens]) if history is not None else None  # as the target's row after them
    if params.greedy:  # greedy verification needs no draft probabilities
        row = logits if penalty_row is None else adjust_logits(logits, params, penalty_row)
        token = greedy_token(row)
        return token, None, float(torch.softmax(row.float().reshape(-1), -1)[token]) if confidence else None
    probs = final_probs(logits[None], params, penalty_row)[0]
    if request.noise is not None:  # the race the target's seeded choice at this position runs
        token = int(race(probs, request.noise.exponentials(position)))
    else:
        token = sample(probs, request.generator)
    return token, probs, float(probs[token]) if confidence else None


class BatchDraftModel:
    name = "draft"

    def __init__(self, model: LlamaModel, max_batch: int, max_len: int):
        self.runner = BatchRunner(model, max_batch, max_len)
        self.cached: list[list[int]] = [[] for _ in range(max_batch)]  # per slot: tokens in its cache
        self.verified = [0] * max_batch  # per slot: leading cached tokens known to equal the context
        self.guessers = [Guesser() for _ in range(max_batch)]  # per slot (DraftModelProposer's guesses)

    def memory_bytes(self) -> int:
        return self.runner.memory_bytes()

    def reset(self, slot: int) -> None:
        self.runner.rollback(slot, 0)
        self.cached[slot], self.verified[slot] = [], 0

    def prefill(self, slot: int, ids: list[int]) -> None:
        """Feed prompt tokens (a chunk of the prompt but its last token, as the target gets)."""
        self.runner.extend_slot(slot, ids, want_logits=False)
        self.cached[slot] += ids
        self.verified[slot] = len(self.cached[slot])

    def move(self, src: int, dst: int) -> None:
        self.runner.move(src, dst)
        self.cached[dst], self.verified[dst] = self.cached[src], self.verified[src]
        self.guessers[dst], self.guessers[src] = self.guessers[src], Guesser()
        self.reset(src)

    def _sync(self, slot: int, context: list[int]) -> list[int]:
        """Roll the slot back to its common prefix with context; return what to feed."""
        cached = self.cached[slot]
        n = min(self.verified[slot], len(context) - 1)
        limit = min(len(cached), len(context) - 1)  # always feed at least one token
        while n < limit and cached[n] == context[n]:
            n += 1
        self.runner.rollback(slot, n)
        del cached[n:]
        self.verified[slot] = n
        return context[n:]

    def _pass(self, feeds: dict[int, list[int]], last: dict[int, int] | None = None) -> dict[int, torch.Tensor]:
        """One batched pass: feeds[slot] appended to each slot; the last logits rows per slot
        (last[slot] of them, else one: [n, V])."""
        rows = [feeds.get(slot, []) for slot in range(max(feeds) + 1)]
        logits = self.runner.forward(PassPlan(rows, want_hidden=False))
        for slot, ids in feeds.items():
            self.cached[slot] += ids
        return {slot: logits[slot][len(ids) - (last or {}).get(slot, 1):] for slot, ids in feeds.items()}

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> dict[int, Proposal]:
        """Up to request.k drafts per sequence: a catch-up pass for slots that fell behind
        (after plain steps; timed apart as sync_seconds), then one pass per draft position.
        Proposals by slot."""
        requests = [r for r in requests if min(r.k, self.runner.max_len - len(r.context)) > 0]
        if not requests:
            return {}
        feeds = {r.slot: self._sync(r.slot, r.context) for r in requests}
        t0 = time.perf_counter()
        behind = {slot: feed[:-1] for slot, feed in feeds.items() if len(feed) > 2}
        if behind:
            self._pass(behind)
            feeds.update({slot: feeds[slot][-1:] for slot in behind})
        sync_seconds = time.perf_counter() - t0 if behind else 0.0
        tokens = {r.slot: [] for r in requests}
        probs: dict[int, list[torch.Tensor]] = {r.slot: [] for r in requests}
        ks = {r.slot: min(r.k, self.runner.max_len - len(r.context)) for r in requests}
        for r in requests:
            self.guessers[r.slot].follow(r.context)
        while active := [r for r in requests if len(tokens[r.slot]) < ks[r.slot]]:
            room = max(0, (GUESS_ROWS - len(active)) // len(active))  # guesses a sequence, within GUESS_ROWS
            left = {r.slot: ks[r.slot] - len(tokens[r.slot]) - 1 for r in active}  # drafts after the next
            guesses = {r.slot: self.guessers[r.slot].guess(tokens[r.slot], min(room, left[r.slot])) for r in active}
            logits = self._pass({r.slot: feeds[r.slot] + guesses[r.slot] for r in active},
                                {r.slot: len(guesses[r.slot]) + 1 for r in active})
            for r in active:
                guess, drafted = guesses[r.slot], tokens[r.slot]
                for i, row_logits in enumerate(logits[r.slot]):  # a row a draft, as passes of their own
                    token, row, _ = draw(row_logits, r, drafted, len(r.context) + len(drafted))
                    drafted.append(token)
                    if row is not None:
                        probs[r.slot].append(row)
                    if i == len(guess) or token != guess[i] or len(drafted) == ks[r.slot]:
                        break
                if unconfirmed := len(guess) - i:  # the cache keeps the guesses drafted; the last draft is fed next
                    del self.cached[r.slot][len(self.cached[r.slot]) - unconfirmed:]
                    self.runner.rollback(r.slot, len(self.cached[r.slot]))
                feeds[r.slot] = [token]
        return {r.slot: Proposal(tokens[r.slot], torch.stack(probs[r.slot]) if probs[r.slot] else None,
                                 sync_seconds=sync_seconds if r.slot in behind else 0.0) for r in requests}
