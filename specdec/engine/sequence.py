"""One generation in progress (Sequence) and what it yields: a StreamChunk per decode step and
a GenerationResult at the end."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.engine.text import TextStream
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import TokenLogprob
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise
from specdec.spec.controller import Controller
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
    history: TokenHistory | None = None  # token counts for penalties (None: params not penalized)
    token_logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None
    noise: PositionNoise | None = None  # seeded drafter-invariant sampling (params.drafter_invariant)

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)
