"""The decode loop. Each step: the controller picks K, the proposer drafts up to K tokens, the
target scores [last token] + drafts in one forward pass, the verifier keeps a prefix plus one
target token, and both caches roll back past the rejected drafts.

Invariant: the target cache holds the context except its last token, which is fed first in
the next step (so its logits come out of the same pass that scores the drafts)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specdec.controller import Controller, DraftLengthController, TreeSizeController
from specdec.errors import SpecdecError
from specdec.models.runner import Runner
from specdec.proposers.base import Proposal, Proposer
from specdec.sampling import SamplingParams, final_probs, make_generator
from specdec.stats import GenerationStats, StepRecord
from specdec.text import TextStream, TextTokenizer
from specdec.verify import (
    TorchRandom,
    tree_attention_mask,
    tree_depths,
    verify_greedy,
    verify_rejection,
    verify_tree_greedy,
    verify_tree_sampling,
    verify_tree_typical,
)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: GenerationStats
    prompt_tokens: int = 0


@dataclass
class Verified:
    """What the target's pass kept of one proposal."""
    new_tokens: list[int]  # accepted drafts + the target's own token
    num_accepted: int
    kept: list[int]  # rows of the verify pass that stay in the cache
    target_seconds: float


@dataclass
class StreamChunk:
    text: str  # new text since the previous chunk
    token_ids: list[int]  # new token ids since the previous chunk
    result: GenerationResult | None = None  # set on the last chunk
    step: StepRecord | None = None  # the decode step that produced this chunk, if any


@dataclass
class Sequence:
    """One generation in progress: everything the step loop carries from one step to the next.
    (The batched engine will hold one of these per slot.)"""
    prompt_ids: list[int]
    params: SamplingParams
    controller: Controller
    generator: torch.Generator
    rng: TorchRandom
    text: TextStream
    stats: GenerationStats
    started_at: float
    context: list[int]  # prompt + generated; the target cache holds all but its last token
    generated: list[int]
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length" once done

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)


class Engine:
    def __init__(self, target: Runner, tokenizer: TextTokenizer, proposer: Proposer | None = None,
                 method: str = "none", eos_ids: tuple[int, ...] = (), max_draft_tokens: int = 8,
                 fixed_draft_tokens: int | None = None, typical_acceptance: bool = False):
        self.target = target
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.method = method
        self.eos_ids = frozenset(eos_ids)
        self.max_draft_tokens = max_draft_tokens
        self.fixed_draft_tokens = fixed_draft_tokens
        self.typical_acceptance = typical_acceptance  # LOSSY tree acceptance, off by default
        self._controllers: dict[tuple, Controller] = {}

    @property
    def context_window(self) -> int:
        return self.target.max_len

    @property
    def needs_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden

    def memory_bytes(self) -> int:
        """Weights and caches of the target and the drafter."""
        return self.target.memory_bytes() + (self.proposer.memory_bytes() if self.proposer is not None else 0)

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            if not self.eos_ids:
                raise SpecdecError("the prompt is empty")
            ids = [min(self.eos_ids)]  # start of a fresh document
        if len(ids) >= self.context_window:
            raise SpecdecError(f"the prompt has {len(ids)} tokens; the model's context window is "
                               f"{self.context_window} tokens (room is needed for at least one new token)")
        return ids

    def controller_for(self, params: SamplingParams) -> Controller:
        """One controller per sampling setting, kept across generations: measured costs carry
        over, and acceptance (which depends on temperature and filters) is tracked apart."""
        key = (params.temperature, params.top_k, params.top_p, params.min_p)
        if key not in self._controllers:
            if len(self._controllers) >= 64:
                self._controllers.pop(next(iter(self._controllers)))
            self._controllers[key] = self.new_controller()
        return self._controllers[key]

    def new_controller(self) -> Controller:
        if self.proposer is not None and self.proposer.shape == "tree":
            return TreeSizeController(self.proposer.tree_sizes, fixed_size=self.fixed_draft_tokens)
        return DraftLengthController(max_k=self.max_draft_tokens, fixed_k=self.fixed_draft_tokens)

    # ---------------------------------------------------------------- one generation
    def start(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        """Reset the caches and prefill the prompt (all but its last token)."""
        prompt_ids = self.encode_prompt(prompt)
        started_at = time.perf_counter()
        generator = make_generator(params.seed)
        controller = self.controller_for(params)
        controller.start_sequence()
        seq = Sequence(prompt_ids, params, controller, generator, TorchRandom(generator),
                       TextStream(self.tokenizer, params.stop),
                       GenerationStats(self.method, lossy=self.typical_acceptance and not params.greedy),
                       started_at, context=list(prompt_ids), generated=[])
        self.target.reset()
        if self.proposer is not None:
            self.proposer.reset(prompt_ids)
        if len(prompt_ids) > 1:
            self.target.extend(prompt_ids[:-1], want_hidden=self.needs_hidden)
            if self.needs_hidden:
                self.proposer.observe_target(self.target.last_hidden, prefill=True)
        seq.stats.prefill_seconds = time.perf_counter() - started_at
        return seq

    def step(self, seq: Sequence) -> StepRecord:
        """One decode step: choose K, draft, verify in one target pass, emit the kept tokens.
        Sets seq.finish_reason when the generation is over."""
        t0 = time.perf_counter()
        room = self.target.max_len - len(seq.context)  # cache room left after the fed tokens
        budget = self._choose_budget(seq, room)
        proposal = (self.proposer.propose(seq.context, budget, seq.params, seq.generator) if budget > 0
                    else Proposal([]))
        t1 = time.perf_counter()
        verify = self._verify_chain if proposal.parents is None else self._verify_tree
        verified = verify(seq.context[-1], proposal, seq.params, seq.rng)
        if self.needs_hidden:
            self.proposer.observe_target(self.target.last_hidden[verified.kept])
        new, hit_eos = self._cut(verified.new_tokens, seq)
        seq.context.extend(new)
        seq.generated.extend(new)
        text = seq.text.push(new)
        stopped = hit_eos or seq.text.stopped
        step = StepRecord(budget=budget, drafted=len(proposal.tokens), accepted=verified.num_accepted,
                          new_tokens=tuple(new), text=text,
                          draft_seconds=t1 - t0 - proposal.sync_seconds, sync_seconds=proposal.sync_seconds,
                          target_seconds=verified.target_seconds,
                          other_seconds=time.perf_counter() - t1 - verified.target_seconds, stopped=stopped)
        if self.proposer is not None:
            seq.controller.observe(step)
        seq.stats.add(step)
        if stopped:
            seq.finish_reason = "stop"
        elif seq.remaining <= 0 or self.target.max_len - len(seq.context) <= 0:
            seq.finish_reason = "length"
        return step

    def finish(self, seq: Sequence) -> tuple[GenerationResult, str]:
        """The result, and the text held back until now (an incomplete character, a possible
        stop-string prefix) that the caller has not seen yet."""
        tail = seq.text.finish()
        seq.stats.wall_seconds = time.perf_counter() - seq.started_at
        return GenerationResult(seq.text.emitted, seq.generated, seq.finish_reason or "length", seq.stats,
                                len(seq.prompt_ids)), tail

    def _choose_budget(self, seq: Sequence, room: int) -> int:
        if self.proposer is None or (self.needs_hidden and self.target.length == 0):
            return 0  # no drafter, or a feature drafter before any target features exist
        if self.proposer.shape == "tree":
            return seq.controller.choose(room - 1)
        return seq.controller.choose(min(seq.remaining - 1, room - 1))

    def _cut(self, tokens: list[int], seq: Sequence) -> tuple[list[int], bool]:
        """Tokens up to and including the first EOS, and at most the tokens still allowed."""
        tokens = tokens[:seq.remaining]
        if not seq.params.ignore_eos:
            for i, token in enumerate(tokens):
                if token in self.eos_ids:
                    return tokens[:i + 1], True
        return tokens, False

    def _target_pass(self, ids: list[int], **kwargs) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        logits = self.target.extend(ids, want_hidden=self.needs_hidden, **kwargs)
        return logits, time.perf_counter() - t0

    def _verify_chain(self, last: int, proposal: Proposal, params: SamplingParams, rng: TorchRandom) -> Verified:
        """Score [last] + drafts in one pass; keep the accepted prefix in the cache."""
        drafts, start = proposal.tokens, self.target.length
        logits, seconds = self._target_pass([last] + drafts)
        target_probs = final_probs(logits, params)
        if params.greedy:
            verdict = verify_greedy(drafts, target_probs)
        else:
            verdict = verify_rejection(drafts, proposal.draft_probs, target_probs, rng)
        n = verdict.num_accepted
        self.target.rollback(start + 1 + n)
        return Verified(drafts[:n] + [verdict.next_token], n, list(range(n + 1)), seconds)

    def _verify_tree(self, last: int, proposal: Proposal, params: SamplingParams, rng: TorchRandom) -> Verified:
        """Score [last] + tree nodes in one pass with a tree mask; keep only the accepted path."""
        drafts, parents, start = proposal.tokens, proposal.parents, self.target.length
        depths = torch.tensor([0] + tree_depths(parents))
        logits, seconds = self._target_pass([last] + drafts, attn_mask=tree_attention_mask(parents),
                                            positions=start + depths)
        target_probs = final_probs(logits, params)
        if params.greedy:
            verdict = verify_tree_greedy(drafts, parents, target_probs)
        elif self.typical_acceptance:
            verdict = verify_tree_typical(drafts, parents, target_probs, rng)
        else:
            verdict = verify_tree_sampling(drafts, parents, target_probs, rng, proposal.draft_probs, proposal.draws)
        kept = [0] + [1 + i for i in verdict.path]
        self.target.keep(start, kept)
        return Verified([drafts[i] for i in verdict.path] + [verdict.next_token], len(verdict.path), kept, seconds)

    # ---------------------------------------------------------------- the loop
    def generate(self, prompt: str | list[int], params: SamplingParams) -> GenerationResult:
        result = None
        for chunk in self.stream(prompt, params):
            result = chunk.result
        return result

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[StreamChunk]:
        """A chunk per step; the last chunk carries the result (and, when EOS or a stop string
        ended the generation, that step's tokens)."""
        seq = self.start(prompt, params)
        last_step = None
        while seq.finish_reason is None:
            step = self.step(seq)
            if step.stopped:
                last_step = step
                break
            yield StreamChunk(step.text, list(step.new_tokens), step=step)
        result, tail = self.finish(seq)
        if last_step is None:
            yield StreamChunk(tail, [], result)
        else:
            yield StreamChunk(last_step.text + tail, list(last_step.new_tokens), result, step=last_step)
