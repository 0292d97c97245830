"""One generation in progress (Sequence) and what it yields: a StreamChunk per decode step and
a GenerationResult at the end."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.engine.text import TextStream
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import TokenLogprob
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise
from specdec.spec.control.base import Controller
from specdec.spec.verify import TorchRandom
from specdec.stats import GenerationStats, StepRecord


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: GenerationStats
    prompt_tokens: int = 0
    token_logprobs: list[TokenLogprob] | None = None  # per token_ids entry, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first: None)


@dataclass
class StreamChunk:
    text: str  # new text since the previous chunk
    token_ids: list[int]  # new token ids since the previous chunk
    result: GenerationResult | None = None  # set on the last chunk
    step: StepRecord | None = None  # the decode step that produced this chunk, if any
    token_logprobs: list[TokenLogprob] | None = None  # per token_ids entry, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first chunk, when asked for


@dataclass
class Sequence:
    """One generation in progress: everything the step loop carries from one step to the next
    (the batched engine holds one per slot), and its stop rules."""
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
    history: TokenHistory | None = None  # token counts for penalties (None: params not penalized)
    token_logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None
    noise: PositionNoise | None = None  # seeded drafter-invariant sampling (params.drafter_invariant)

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)

    def cut(self, tokens: list[int], eos_ids: frozenset[int]) -> tuple[list[int], bool]:
        """A step's tokens up to and including the first EOS (or stop token), and at most the
        tokens still allowed; whether an end token was met."""
        tokens = tokens[:self.remaining]
        ends = self.params.stop_token_ids
        for i, token in enumerate(tokens):
            if (token in eos_ids and not self.params.ignore_eos) or token in ends:
                return tokens[:i + 1], True
        return tokens, False

    def past_line_time_limit(self) -> bool:
        """params.line_time_limit passed since the first token, with a line of output complete."""
        limit = self.params.line_time_limit
        if limit is None or "\n" not in self.text.text:
            return False
        return time.perf_counter() - (self.started_at + self.stats.prefill_seconds) > limit

    def finish(self) -> tuple[GenerationResult, str]:
        """The result, and the text held back until now (an incomplete character, a possible
        stop-string prefix) that the caller has not seen yet."""
        tail = self.text.finish()
        self.stats.wall_seconds = time.perf_counter() - self.started_at
        return GenerationResult(self.text.emitted, self.generated, self.finish_reason or "length", self.stats,
                                len(self.prompt_ids), self.token_logprobs, self.prompt_logprobs), tail
