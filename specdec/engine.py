"""The decode loop. Each step: the controller picks K, the proposer drafts up to K tokens, the
target scores [last token] + drafts in one forward pass, the verifier keeps a prefix plus one
target token, and both caches roll back past the rejected drafts.

Invariant: the target cache holds the context except its last token, which is fed first in
the next step (so its logits come out of the same pass that scores the drafts)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

from specdec.controller import DraftLengthController, TreeSizeController
from specdec.errors import SpecdecError
from specdec.proposers.base import Proposal, Proposer
from specdec.sampling import SamplingParams, final_probs, make_generator
from specdec.text import TextStream, TextTokenizer
from specdec.verify import (TorchRandom, tree_attention_mask, tree_depths, verify_greedy, verify_rejection,
                            verify_tree_greedy, verify_tree_sampling, verify_tree_typical)


@dataclass
class GenerationStats:
    method: str
    lossy: bool = False  # True only with typical acceptance at T > 0
    new_tokens: int = 0
    target_forwards: int = 0  # decoding passes (the prompt's prefill pass is not counted)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_length_histogram: list[int] = field(default_factory=list)  # steps by drafts kept
    draft_tokens_per_step: list[int] = field(default_factory=list)  # K chosen each step
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    other_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.method != "none"

    @property
    def acceptance_rate(self) -> float | None:
        if not self.speculative:
            return None
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens produced per target forward (accepted drafts + the target's own token)."""
        if not self.speculative:
            return None
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def record_step(self, drafted: int, accepted: int) -> None:
        self.target_forwards += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.draft_tokens_per_step.append(drafted)
        if len(self.accepted_length_histogram) <= accepted:
            self.accepted_length_histogram.extend([0] * (accepted + 1 - len(self.accepted_length_histogram)))
        self.accepted_length_histogram[accepted] += 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("draft_tokens_per_step")
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 tokens_per_second=self.tokens_per_second)
        return d

    @staticmethod
    def merge(all_stats: list["GenerationStats"]) -> "GenerationStats":
        out = GenerationStats(all_stats[0].method, lossy=any(s.lossy for s in all_stats))
        for s in all_stats:
            for name in ("new_tokens", "target_forwards", "drafted_tokens", "accepted_tokens",
                         "prefill_seconds", "draft_seconds", "target_seconds", "other_seconds",
                         "wall_seconds"):
                setattr(out, name, getattr(out, name) + getattr(s, name))
            for i, c in enumerate(s.accepted_length_histogram):
                if len(out.accepted_length_histogram) <= i:
                    out.accepted_length_histogram.append(0)
                out.accepted_length_histogram[i] += c
        return out


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: GenerationStats
    prompt_tokens: int = 0


@dataclass
class StepOutcome:
    new_tokens: list[int]  # accepted drafts + the target's own token
    num_accepted: int
    kept: list[int]  # rows of the verify pass that stay in the cache
    target_seconds: float


@dataclass
class StreamChunk:
    text: str  # new text since the previous chunk
    token_ids: list[int]  # new token ids since the previous chunk
    result: GenerationResult | None = None  # set on the last chunk


class Engine:
    def __init__(self, target, tokenizer: TextTokenizer, proposer: Proposer | None = None,
                 method: str = "none", eos_ids: tuple[int, ...] = (), max_draft_tokens: int = 8,
                 fixed_draft_tokens: int | None = None, typical_acceptance: bool = False):
        self.target = target
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.method = method
        self.eos_ids = set(eos_ids)
        self.max_draft_tokens = max_draft_tokens
        self.fixed_draft_tokens = fixed_draft_tokens
        self.typical_acceptance = typical_acceptance  # LOSSY tree acceptance, off by default
        self._controllers: dict = {}

    @property
    def context_window(self) -> int:
        return self.target.max_len

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

    def controller_for(self, params: SamplingParams):
        """One controller per sampling setting, kept across generations: measured costs carry
        over, and acceptance (which depends on temperature and filters) is tracked apart."""
        key = (params.temperature, params.top_k, params.top_p, params.min_p)
        if key not in self._controllers:
            if len(self._controllers) >= 64:
                self._controllers.pop(next(iter(self._controllers)))
            self._controllers[key] = self.new_controller()
        return self._controllers[key]

    def new_controller(self):
        if self.proposer is not None and self.proposer.shape == "tree":
            return TreeSizeController(self.proposer.tree_sizes, fixed_size=self.fixed_draft_tokens)
        return DraftLengthController(max_k=self.max_draft_tokens, fixed_k=self.fixed_draft_tokens)

    def _target_pass(self, ids: list[int], **kwargs) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        logits = self.target.extend(ids, want_hidden=self.proposer is not None and self.proposer.needs_hidden,
                                    **kwargs)
        return logits, time.perf_counter() - t0

    def _verify_chain(self, last: int, proposal: Proposal, params: SamplingParams, rng: TorchRandom):
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
        return StepOutcome(drafts[:n] + [verdict.next_token], n, list(range(n + 1)), seconds)

    def _verify_tree(self, last: int, proposal: Proposal, params: SamplingParams, rng: TorchRandom):
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
        return StepOutcome([drafts[i] for i in verdict.path] + [verdict.next_token], len(verdict.path), kept, seconds)

    def generate(self, prompt: str | list[int], params: SamplingParams) -> GenerationResult:
        result = None
        for chunk in self.stream(prompt, params):
            result = chunk.result
        return result

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[StreamChunk]:
        prompt_ids = self.encode_prompt(prompt)
        generator = make_generator(params.seed)
        rng = TorchRandom(generator)
        stats = GenerationStats(self.method, lossy=self.typical_acceptance and not params.greedy)
        controller = self.controller_for(params)
        controller.start_sequence()
        text = TextStream(self.tokenizer, params.stop)
        t_start = time.perf_counter()
        target, proposer = self.target, self.proposer
        needs_hidden = proposer is not None and proposer.needs_hidden
        target.reset()
        if proposer is not None:
            proposer.reset(prompt_ids)
        context = list(prompt_ids)
        if len(context) > 1:
            target.extend(context[:-1], want_hidden=needs_hidden)
            if needs_hidden:
                proposer.observe_target(target.last_hidden, prefill=True)
        stats.prefill_seconds = time.perf_counter() - t_start
        generated: list[int] = []
        finish = "length"
        pending_text, pending_ids = "", []
        while True:
            remaining = params.max_new_tokens - len(generated)
            room = target.max_len - len(context)  # cache room left after the fed tokens
            if remaining <= 0 or room <= 0:
                break
            t0 = time.perf_counter()
            k = 0
            if proposer is not None and (not needs_hidden or target.length > 0):
                is_tree = proposer.shape == "tree"
                k = controller.choose(room - 1 if is_tree else min(remaining - 1, room - 1))
            proposal = proposer.propose(context, k, params, generator) if k > 0 else Proposal([])
            drafts = proposal.tokens
            t1 = time.perf_counter()
            verify = self._verify_chain if proposal.parents is None else self._verify_tree
            step = verify(context[-1], proposal, params, rng)
            new, num_accepted, target_seconds = step.new_tokens, step.num_accepted, step.target_seconds
            if needs_hidden:
                proposer.observe_target(target.last_hidden[step.kept])
            stats.record_step(len(drafts), num_accepted)
            hit_eos = False
            for i, tok in enumerate(new):
                if tok in self.eos_ids:
                    new, hit_eos = new[:i + 1], True
                    break
            new = new[:remaining]
            context.extend(new)
            generated.extend(new)
            delta = text.push(new)
            t3 = time.perf_counter()
            if proposer is not None:
                controller.observe(k, len(drafts), num_accepted, target_seconds, t1 - t0 - proposal.sync_seconds,
                                   t3 - t1 - target_seconds)
            stats.draft_seconds += t1 - t0
            stats.target_seconds += target_seconds
            stats.other_seconds += t3 - t1 - target_seconds
            if hit_eos or text.stopped:
                finish = "stop"
                pending_text, pending_ids = delta, new
                break
            yield StreamChunk(delta, new)
        stats.new_tokens = len(generated)
        stats.wall_seconds = time.perf_counter() - t_start
        pending_text += text.finish()
        result = GenerationResult(text.emitted, generated, finish, stats, len(prompt_ids))
        yield StreamChunk(pending_text, pending_ids, result)
