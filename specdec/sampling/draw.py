"""Logits -> the final next-token distribution, and draws from it, as pure functions.

The verifier applies exactly this transform to both target and draft logits, so rejection
sampling is lossless with respect to what the user asked for (penalties and logit bias,
temperature, top-k, top-p, min-p), not just the raw softmax. Penalties depend on the tokens
before each row; penalties.py builds those per-row counts."""
from __future__ import annotations

import torch

from specdec.sampling.params import SamplingParams
from specdec.sampling.penalties import PenaltyRows, adjust_logits


def final_probs(logits: torch.Tensor, params: SamplingParams, history: PenaltyRows | None = None) -> torch.Tensor:
    """Final distribution over the last dimension. Greedy gives a one-hot on the argmax.
    Computed in float64 when the logits are float64, else float32. history: the per-row
    token counts when params.penalized (penalties.py), applied to the logits first; greedy is
    then the argmax of the adjusted logits.

    Finite for every value validate() accepts, however extreme:
    - logits are shifted so that the largest is 0 before the division, so a tiny temperature
      sends the others to -inf (the limit T -> 0+: all mass on the argmax, ties split) rather
      than overflowing to inf - inf = NaN;
    - the temperature is clamped into the dtype's normal range: in float32 a temperature
      below 1.2e-38 would round to 0 (0/0) and one above 3.4e38 to inf (-inf/inf); the result
      is the same limit either way;
    - top-k masks before the division (the ranking is the same at any T > 0), so a huge
      temperature cannot merge the k-th logit with the ones below it;
    - top-p ranks tokens by logit and always keeps the first, also when top_p rounds to 0 in
      float32 or a huge temperature makes the probabilities equal."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if history is not None:
        logits = adjust_logits(logits, params, history)
    elif params.penalized or params.grammar is not None:
        raise ValueError("penalized or constrained sampling needs each row's token history "
                         "(penalties.TokenHistory.rows)")
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(dtype)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    limits = torch.finfo(dtype)
    temperature = min(max(params.temperature, limits.tiny), limits.max)
    probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, dim=-1)
    if params.top_p < 1.0:
        # most probable first, ranked by logit: a huge temperature rounds probabilities to ties
        order = logits.argsort(dim=-1, descending=True)
        sorted_p = probs.gather(-1, order)
        # keep a token if the mass strictly before it is < top_p; the first always stays
        before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        threshold = params.min_p * probs.max(-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(-1, keepdim=True)


SAMPLE_BLOCK = 256  # tokens per block of sample()'s first level


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's index of its first largest logit, as torch's argmax gives it. bfloat16 /
    float16 rows are widened first (exactly): torch's argmax over a 152k-token bfloat16 row took
    0.50 ms, over its float32 copy 0.10 (AMD EPYC Zen 5, 2 threads), once a decoded or drafted
    token."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return logits.argmax(-1)


def greedy_token(logits: torch.Tensor) -> int:
    """greedy_tokens of one row [V]."""
    return int(greedy_tokens(logits))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution (any scale; zeros are never drawn) by inverting
    its CDF in float64 in two levels, block sums then the tokens of one block: torch.multinomial
    took ~4 ms a draw over a 152k vocabulary here (7% of a Qwen2.5-Coder-1.5B step at T=1),
    this ~0.2 ms."""
    pad = -probs.shape[0] % SAMPLE_BLOCK
    blocks = torch.nn.functional.pad(probs, (0, pad)).view(-1, SAMPLE_BLOCK)
    cdf = blocks.sum(1, dtype=torch.float64).cumsum(0)
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(cdf[-1])
    last_block = int((cdf < cdf[-1]).sum())  # the last block with mass
    b = min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True)), last_block)
    row = blocks[b].double()
    before = float(cdf[b - 1]) if b else 0.0
    i = int(torch.searchsorted(row.cumsum(0), torch.tensor([u - before], dtype=torch.float64), right=True))
    # rounding between the two levels may point past the block's last token with mass
    last = int(row.nonzero()[-1])
    return b * SAMPLE_BLOCK + min(i, last)


def draw_distinct(probs: torch.Tensor, n: int, generator: torch.Generator | None,
                  support: int = 64, exponentials: torch.Tensor | None = None,
                  ) -> tuple[list[list[int]], torch.Tensor]:
    """Per row of probs [R, V], n distinct tokens drawn without replacement, in draw order, and
    the distribution they were drawn from: each row restricted to its `support` most probable
    tokens and renormalised (the verifier must be given this one), so that a draw costs
    random numbers for `support` tokens, not V. An exponential race: token i arrives at
    E_i / p_i with E_i ~ Exp(1), and the arrival order is a sequential draw without
    replacement. Rows run short when fewer than n tokens have mass. exponentials [R, V]: the
    E_i to race with (seeded.PositionNoise rows) instead of fresh ones from the generator."""
    if support < probs.shape[-1]:
        top = probs.topk(support, dim=-1)
        compact, index = top.values / top.values.sum(-1, keepdim=True), top.indices
        drawn_from = torch.zeros_like(probs).scatter_(-1, index, compact)
    else:
        compact, index, drawn_from = probs, None, probs
    if exponentials is None:
        uniform = torch.rand(compact.shape, generator=generator, dtype=compact.dtype, device=compact.device)
        exponentials = -uniform.clamp_min(torch.finfo(compact.dtype).tiny).log()
    elif index is not None:
        exponentials = exponentials.gather(-1, index)
    arrival_rate = compact / exponentials.to(compact.dtype)  # p / Exp(1)
    order = arrival_rate.topk(min(n, compact.shape[-1]), dim=-1)
    tokens = order.indices if index is None else index.gather(-1, order.indices)
    return [[t for t, rate in zip(row_tokens, rates) if rate > 0]
            for row_tokens, rates in zip(tokens.tolist(), order.values.tolist())], drawn_from


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return g
