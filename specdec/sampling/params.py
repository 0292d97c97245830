"""What a request asks of sampling (SamplingParams) and the accepted range of each field.

The accepted range of each numeric field is data (SAMPLING_BOUNDS): `validate` checks it here
and the server's request parser checks the same table, so the two can never disagree. Every
value in range gives a finite distribution (see final_probs)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.errors import SpecdecError
from specdec.sampling.grammar import Grammar


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
            raise SpecdecError(f"grammar must be a specdec.sampling.grammar.Grammar, got {type(p.grammar).__name__}")
        if p.ignore_eos:
            raise SpecdecError("ignore_eos cannot be combined with a grammar (the grammar's end is an EOS)")
    for s in p.stop:
        if not isinstance(s, str) or not s:
            raise SpecdecError(f"stop strings must be non-empty strings, got {s!r}")
