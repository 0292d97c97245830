"""Logits -> the final next-token distribution, as pure functions.

The verifier applies exactly this transform to both target and draft logits, so rejection
sampling is lossless with respect to what the user asked for (temperature, top-k, top-p,
min-p), not just the raw softmax."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate(p: SamplingParams) -> None:
    if not _is_number(p.temperature) or not math.isfinite(p.temperature) or p.temperature < 0:
        raise SpecdecError(f"temperature must be a finite number >= 0, got {p.temperature!r}")
    if not isinstance(p.top_k, int) or isinstance(p.top_k, bool) or p.top_k < 0:
        raise SpecdecError(f"top_k must be an integer >= 0 (0 = off), got {p.top_k!r}")
    if not _is_number(p.top_p) or not (0 < p.top_p <= 1):
        raise SpecdecError(f"top_p must be in (0, 1], got {p.top_p!r}")
    if not _is_number(p.min_p) or not (0 <= p.min_p <= 1):
        raise SpecdecError(f"min_p must be in [0, 1], got {p.min_p!r}")
    if not isinstance(p.max_new_tokens, int) or isinstance(p.max_new_tokens, bool) or p.max_new_tokens < 1:
        raise SpecdecError(f"max_new_tokens must be an integer >= 1, got {p.max_new_tokens!r}")
    if p.seed is not None and (not isinstance(p.seed, int) or isinstance(p.seed, bool)):
        raise SpecdecError(f"seed must be an integer, got {p.seed!r}")
    for s in p.stop:
        if not isinstance(s, str) or not s:
            raise SpecdecError(f"stop strings must be non-empty strings, got {s!r}")


def final_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Final distribution over the last dimension. Greedy gives a one-hot on the argmax.
    Computed in float64 when the logits are float64, else float32."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(dtype)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep a token if the mass strictly before it is < top_p (the first always stays)
        before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        threshold = params.min_p * probs.max(-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def draw_distinct(probs: torch.Tensor, n: int, generator: torch.Generator | None,
                  support: int = 64) -> tuple[list[list[int]], torch.Tensor]:
    """Per row of probs [R, V], n distinct tokens drawn without replacement, in draw order, and
    the distribution they were drawn from: each row restricted to its `support` most probable
    tokens and renormalised (the verifier must be given this one), so that a draw costs
    random numbers for `support` tokens, not V. An exponential race: token i arrives at
    E_i / p_i with E_i ~ Exp(1), and the arrival order is a sequential draw without
    replacement. Rows run short when fewer than n tokens have mass."""
    if support < probs.shape[-1]:
        top = probs.topk(support, dim=-1)
        compact, index = top.values / top.values.sum(-1, keepdim=True), top.indices
        drawn_from = torch.zeros_like(probs).scatter_(-1, index, compact)
    else:
        compact, index, drawn_from = probs, None, probs
    uniform = torch.rand(compact.shape, generator=generator, dtype=compact.dtype, device=compact.device)
    arrival_rate = compact / -uniform.clamp_min(torch.finfo(compact.dtype).tiny).log()  # p / Exp(1)
    order = arrival_rate.topk(min(n, compact.shape[-1]), dim=-1)
    tokens = order.indices if index is None else index.gather(-1, order.indices)
    return [[t for t, rate in zip(row_tokens, rates) if rate > 0]
            for row_tokens, rates in zip(tokens.tolist(), order.values.tolist())], drawn_from


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return g
