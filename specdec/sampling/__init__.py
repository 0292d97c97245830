"""Sampling: what a request asks for (params.py), logits -> the final distribution and draws
from it (draw.py), penalties and logit bias, grammars, seeded drafter-invariant draws and
log-probabilities. The names most callers need are re-exported here."""
from specdec.sampling.draw import (
    SAMPLE_BLOCK,
    draw_distinct,
    final_probs,
    greedy_token,
    greedy_tokens,
    make_generator,
    sample,
)
from specdec.sampling.params import (
    LOGIT_BIAS_BOUNDS,
    MAX_LOGPROBS,
    OPTIONAL_BOUNDS,
    SAMPLING_BOUNDS,
    SEED_MODES,
    Bounds,
    SamplingParams,
    is_integer,
    is_number,
    validate,
)

__all__ = ["LOGIT_BIAS_BOUNDS", "MAX_LOGPROBS", "OPTIONAL_BOUNDS", "SAMPLE_BLOCK", "SAMPLING_BOUNDS", "SEED_MODES",
           "Bounds", "SamplingParams", "draw_distinct", "final_probs", "greedy_token", "greedy_tokens", "is_integer",
           "is_number", "make_generator", "sample", "validate"]
