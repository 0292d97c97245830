"""A small draft model with its own KV cache, proposing a chain of k tokens."""
from __future__ import annotations

import time

import torch

from specdec.models.cache import shared_prefix
from specdec.models.runner import Runner
from specdec.sampling import SamplingParams
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.batch_draft import DraftRequest, draw
from specdec.spec.proposers.prompt_lookup import LOOKUP_TOKENS, Guesser, PromptLookupProposer, with_lookup_chain

READ_SAMPLE = 32  # catch-ups of at least this many tokens time the draft's reading rate
# The most a catch-up reads: further behind (a long prompt, many plain steps), the draft restarts
# from the context's last DRAFT_WINDOW tokens (at position 0) instead of reading all it lacks. On the
# Qwen pair under a ~2,000-token file the 0.5B draft's reads of the whole prompt (~2 s each, paid
# again by its controller's probes) made decoding 0.63x plain; a draft guesses the next tokens
# from the recent text (any drafts are exact). A context within the window is read whole, as before.
DRAFT_WINDOW = 512


class DraftModelProposer:
    name = "draft"
    shape = "chain"
    needs_hidden = False
    stops_at_floor = True  # propose takes a confidence floor (its controller's break-even)

    def __init__(self, runner: Runner, reuse_prefix: bool = True, lookup: bool = False, ahead: bool = True):
        self.runner = runner
        self.reuse_prefix = reuse_prefix  # off where every run must pay for its prompt (bench)
        # greedy drafts also hold the prompt-lookup chain (a tree where they differ): the target
        # must verify trees; a proposal of budget k then holds up to max(k, tree_floor) nodes
        self.lookup = PromptLookupProposer() if lookup else None
        self.tree_floor = LOOKUP_TOKENS + 1 if lookup else 0
        self.cached: list[int] = []  # the tokens whose keys/values are in the draft cache: context[offset:]
        self.offset = 0  # where the draft's context starts in the sequence's (DRAFT_WINDOW)
        self.window = min(DRAFT_WINDOW, runner.max_len // 2)
        self.verified = 0  # leading cached tokens known to equal the context (which only grows)
        self.read_seconds_per_token: float | None = None  # timed on catch-ups of READ_SAMPLE tokens or more
        # drafting guesses its next tokens by prompt lookup and checks them in its passes (Guesser):
        # its drafts are the same either way (on the one-call stack, whose rows do not depend on a
        # pass's width; elsewhere up to rounding): each row is drawn from in order, as a pass of
        # its own would be, and the rows after the first draft that differs from its guess dropped
        self.ahead = ahead
        self.guesser = Guesser()

    def memory_bytes(self) -> int:
        return self.runner.memory_bytes()

    def reset(self, prompt_ids: list[int]) -> None:
        """A new text: keep the prefix of the prompt the draft cache already holds where its rows
        are what a fresh prefill writes (Runner.kv_rows_invariant: the drafts, and so the speed,
        never depend on earlier prompts; past DRAFT_WINDOW, on where the draft last restarted).
        A draft that restarted at `offset` keeps its cache where the prompt holds the same tokens
        from there on: an editor's next request (the file to a cursor a few lines on) then reads
        only what is new, where it used to read its whole window again, which its controller
        would not pay for a short completion (Qwen pair: every request after the first decoded
        plainly; bench/results/README.md "stop 69").
        The rest is read at the first draft (propose's catch-up, timed as sync_seconds), as a
        batch's drafters and the EAGLE head read theirs: a request whose controller keeps to
        plain steps (T=1 where drafts are rarely kept) never pays the draft's prefill (the Qwen
        pair's 0.5B: 0.2-0.7 s a prompt)."""
        n = 0
        if (self.reuse_prefix and getattr(self.runner, "kv_rows_invariant", False)
                and self.runner.length == len(self.cached) and len(prompt_ids) - 1 > self.offset):
            n = shared_prefix(self.cached, prompt_ids, min(len(self.cached), len(prompt_ids) - 1 - self.offset),
                              offset=self.offset)
        self.runner.rollback(n)
        self.cached = list(prompt_ids[self.offset:self.offset + n])
        self.offset = self.offset if n else 0
        self.verified = n

    def upfront_seconds(self, context: list[int]) -> float:
        """Seconds the next draft would first spend reading what the draft cache lacks (its
        prompt, the tokens of plain steps since): 0 until a read was timed."""
        unread = min(len(context) - self.offset - len(self.cached), self.window) - 2  # 2 tokens: a draft pass
        return unread * self.read_seconds_per_token if unread > 0 and self.read_seconds_per_token else 0.0

    def _restart_if_behind(self, context: list[int], k: int) -> None:
        """From the context's last `window` tokens where more than that is unread, or where the
        draft's cache could not hold k more tokens."""
        behind = len(context) - self.offset - len(self.cached)
        if behind > self.window or len(context) - self.offset + k > self.runner.max_len:
            self.offset = max(0, len(context) - self.window)
            self.runner.rollback(0)
            self.cached, self.verified = [], 0

    def _sync(self, context: list[int]) -> list[int]:
        """Roll the draft cache back to its common prefix with context; return what to feed.
        The engine only appends to the context between resets, so the comparison starts after
        the prefix matched last time: O(drafted tokens) per step, not O(context)."""
        own = len(context) - self.offset  # the draft's context: context[offset:]
        limit = min(len(self.cached), own - 1)  # always feed at least one token
        n = shared_prefix(self.cached, context, limit, start=min(self.verified, own - 1), offset=self.offset)
        self.runner.rollback(n)
        del self.cached[n:]
        self.verified = n
        return context[self.offset + n:]

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None, floor: float | None = None) -> Proposal:
        """Up to k drafts; fewer where the product of the draft's probabilities of its drafts so
        far (how likely the target keeps them all) falls below floor: one more draft pass would
        then cost more than the token it is expected to add (the controller's break-even,
        DraftLengthController.confidence_floor). A draft's confidence is known only once it is
        drafted, so a fixed K pays for passes after the draft turned unsure, and a K cut short
        for the unsure stretches forgoes the runs of sure ones (Qwen pair, code: drafts to 8
        stopped at 0.5 gave 1.53x plain, a fixed 4 1.42x, the adaptive K without it 1.24x)."""
        if k <= 0:
            return Proposal([], None)
        self._restart_if_behind(context, k)
        k = min(k, self.runner.max_len - (len(context) - self.offset))
        if k <= 0:
            return Proposal([], None)
        feed = self._sync(context)
        sync_seconds = 0.0
        if len(feed) > 2:  # tokens from plain steps: catch up first, timed apart
            t0 = time.perf_counter()
            self.runner.extend(feed[:-1], want_logits=False)
            self.cached.extend(feed[:-1])
            sync_seconds = time.perf_counter() - t0
            if len(feed) > READ_SAMPLE:  # long enough that the pass's fixed costs hardly count
                self.read_seconds_per_token = sync_seconds / (len(feed) - 1)
            feed = feed[-1:]
        request = DraftRequest(0, context, k, params, generator, history, noise)
        tokens, rows = [], []
        confidence, confidences = 1.0, []  # the draft's probability of all its drafts so far, after each
        # a floor of 1 ends the chain at its first draft short of certain: rows of guesses past it are
        # passes' work thrown away (the Qwen pair on Zen 3: draft passes of 1 draft 10-15 ms alone, 21-32 with them)
        guessing = self.ahead and (floor is None or floor < 1.0)
        if guessing:
            self.guesser.follow(context)
        stop = False
        while len(tokens) < k and not stop:
            guess = self.guesser.guess(tokens, k - len(tokens) - 1) if guessing else []
            fed = feed + guess
            out = self.runner.extend(fed, last_logits=not guess)  # a 2-token catch-up needs one row
            self.cached.extend(fed)
            for i, logits in enumerate(out[len(out) - len(guess) - 1:]):
                token, probs, p = draw(logits, request, tokens, len(context) + len(tokens), floor is not None)
                if probs is not None:
                    rows.append(probs)
                confidence *= p if p is not None else 1.0
                tokens.append(token)
                confidences.append(confidence)
                stop = floor is not None and confidence < floor
                if stop or i == len(guess) or token != guess[i] or len(tokens) == k:
                    break
            if guess:  # guess i was checked unless the run stopped at a row past the guesses
                checked = min(i + 1, len(guess))
                self.guesser.observe(checked, checked - (i < len(guess) and token != guess[i]))
            # the cache keeps the guesses the draft drafted itself; its last draft is fed next
            unconfirmed = len(guess) - i
            if unconfirmed:
                del self.cached[len(self.cached) - unconfirmed:]
                self.runner.rollback(len(self.cached))
            feed = [token]
        proposal = Proposal(tokens, torch.stack(rows) if rows else None, sync_seconds=sync_seconds,
                            confidences=confidences if floor is not None else None)
        return proposal if self.lookup is None else with_lookup_chain(proposal, self.lookup, context, k, params,
                                                                        history)

    def observe_target(self, hidden: torch.Tensor) -> None:
        pass
