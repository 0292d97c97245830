"""Logits -> the final next-token distribution, as pure functions.

The verifier applies exactly this transform to both target and draft logits, so rejection
sampling is lossless with respect to what the user asked for (penalties and logit bias,
temperature, top-k, top-p, min-p), not just the raw softmax. Penalties depend on the tokens
before each row; penalties.py builds those per-row counts.

The accepted range of each numeric field is data (SAMPLING_BOUNDS): `validate` checks it here
and the server's request parser checks the same table, so the two can never disagree. Every
value in range gives a finite distribution (see final_probs)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError
from specdec.grammar import Grammar
from specdec.penalties import PenaltyRows, adjust_logits


def is_integer(x) -> bool:
    """An int that is not a bool (JSON true is not 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class Bounds:
    """The values one numeric parameter accepts: [low, high], or (low, high] when low_open,
    finite numbers only. `requirement` is the phrase error messages use ("must be ...")."""
    low: float
    high: float | None = None  # None: no upper bound
    low_open: bool = False
    integer: bool = False
    note: str = ""  # appended to the requirement, e.g. "0 = off"
    text: str = ""  # the requirement in words, when the generated one reads badly

    def accepts(self, value) -> bool:
        if not (is_integer(value) if self.integer else is_number(value)):
            return False
        if not self.integer:
            try:
                value = float(value)
            except OverflowError:  # an integer too large for a float
                return False
            if not math.isfinite(value):
                return False
        above_low = value > self.low if self.low_open else value >= self.low
        return above_low and (self.high is None or value <= self.high)

    @property
    def requirement(self) -> str:
        if self.text:
            return self.text
        kind = "an integer" if self.integer else "a number" if self.high is not None else "a finite number"
        if self.high is None:
            words = f"{kind} {'>' if self.low_open else '>='} {_shown(self.low)}"
        else:
            words = f"{kind} in {'(' if self.low_open else '['}{_shown(self.low)}, {_shown(self.high)}]"
        return f"{words} ({self.note})" if self.note else words


SAMPLING_BOUNDS: dict[str, Bounds] = {
    "temperature": Bounds(0.0),  # 0 = greedy
    "top_k": Bounds(0, integer=True, note="0 = off"),
    "top_p": Bounds(0.0, 1.0, low_open=True),
    "min_p": Bounds(0.0, 1.0),
    "max_new_tokens": Bounds(1, integer=True),
    "presence_penalty": Bounds(-2.0, 2.0),  # OpenAI's range
    "frequency_penalty": Bounds(-2.0, 2.0),
    "repetition_penalty": Bounds(0.0, low_open=True, note="1 = off"),  # HF/vLLM: any positive value
}
MAX_LOGPROBS = 20  # alternatives per position, as OpenAI's top_logprobs
# fields that may also be None (off)
OPTIONAL_BOUNDS: dict[str, Bounds] = {
    "logprobs": Bounds(0, MAX_LOGPROBS, integer=True),
    "prompt_logprobs": Bounds(0, MAX_LOGPROBS, integer=True),
    "line_time_limit": Bounds(0.0, low_open=True, note="seconds"),
}
SEED_MODES = ("invariant", "rejection")
LOGIT_BIAS_BOUNDS = Bounds(-100.0, 100.0)  # OpenAI's range; -100 bans a token, +100 all but forces it


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past EOS (benchmarks: every run makes max_new_tokens)
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # prompt + generated tokens: positive logits / it, negative * it
    # token id -> bias added to its logit; a dict is accepted and stored as sorted (id, bias) pairs
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None = off; N = record each emitted token's log-probability and the N most likely
    # alternatives. Raw model distribution (see logprobs.py for why)
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (from the prefill pass)
    # with a seed and T > 0: "invariant" = every method and draft length reproduce plain
    # sampling's tokens for that seed (seeded.py); "rejection" = rejection sampling, which
    # accepts more drafts but reproduces a seed only for the same method and settings
    seed_mode: str = "invariant"
    # structured output: every position samples only among the tokens the grammar allows
    # (grammar.py); None = unconstrained
    grammar: Grammar | None = None
    # token ids that end the generation as EOS does (vLLM's stop_token_ids; fill-in-the-middle
    # adds its pad and file-separator tokens); they end it even with ignore_eos
    stop_token_ids: tuple[int, ...] = ()
    # seconds after the first generated token past which the generation ends as soon as its
    # text holds a line break (llama.cpp's t_max_predict_ms: an editor gets whole lines in time)
    line_time_limit: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        object.__setattr__(self, "stop_token_ids", _token_ids(self.stop_token_ids))
        validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def drafter_invariant(self) -> bool:
        """Whether tokens are seeded races (seeded.py) rather than rejection sampling."""
        return self.seed is not None and not self.greedy and self.seed_mode == "invariant"

    @property
    def penalized(self) -> bool:
        """Whether the logits are adjusted before temperature (penalties.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


def _bias_pairs(bias) -> tuple:
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = tuple((k, v) for k, v in items)
    except (TypeError, ValueError):
        raise SpecdecError(f"logit_bias must map token ids to biases, got {bias!r}") from None
    for token, value in pairs:
        if not is_integer(token) or token < 0:
            raise SpecdecError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if not LOGIT_BIAS_BOUNDS.accepts(value):
            raise SpecdecError(f"logit_bias values must be {LOGIT_BIAS_BOUNDS.requirement}, "
                               f"got {value!r} for token {token}")
    if len({token for token, _ in pairs}) < len(pairs):
        raise SpecdecError("logit_bias names a token id twice")
    return tuple(sorted((token, float(value)) for token, value in pairs))


def _token_ids(ids) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise SpecdecError(f"stop_token_ids must be a list of token ids, got {ids!r}")
    ids = tuple(ids)
    for token in ids:
        if not is_integer(token) or token < 0:
            raise SpecdecError(f"stop_token_ids must hold token ids (integers >= 0), got {token!r}")
    return tuple(int(t) for t in ids)


def validate(p: SamplingParams) -> None:
    for name, bounds in SAMPLING_BOUNDS.items():
        value = getattr(p, name)
        if not bounds.accepts(value):
            raise SpecdecError(f"{name} must be {bounds.requirement}, got {value!r}")
    for name, bounds in OPTIONAL_BOUNDS.items():
        value = getattr(p, name)
        if value is not None and not bounds.accepts(value):
            raise SpecdecError(f"{name} must be {bounds.requirement} or None (off), got {value!r}")
    if p.seed is not None and not is_integer(p.seed):
        raise SpecdecError(f"seed must be an integer, got {p.seed!r}")
    if p.seed_mode not in SEED_MODES:
        raise SpecdecError(f"seed_mode must be one of {', '.join(SEED_MODES)}, got {p.seed_mode!r}")
    if not isinstance(p.ignore_eos, bool):
        raise SpecdecError(f"ignore_eos must be true or false, got {p.ignore_eos!r}")
    if p.grammar is not None:
        if not isinstance(p.grammar, Grammar):
            raise SpecdecError(f"grammar must be a specdec.grammar.Grammar, got {type(p.grammar).__name__}")
        if p.ignore_eos:
            raise SpecdecError("ignore_eos cannot be combined with a grammar (the grammar's end is an EOS)")
    for s in p.stop:
        if not isinstance(s, str) or not s:
            raise SpecdecError(f"stop strings must be non-empty strings, got {s!r}")


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
