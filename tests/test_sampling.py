import math

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import (
    SAMPLING_BOUNDS,
    SamplingParams,
    final_probs,
    greedy_token,
    greedy_tokens,
    make_generator,
    sample,
)


def P(**kw):
    return SamplingParams(**kw)


LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64))


def test_temperature_one_is_softmax():
    assert torch.allclose(final_probs(LOGITS, P(temperature=1.0)),
                          torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64))


def test_temperature_half_squares_probabilities():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64) ** 2
    assert torch.allclose(final_probs(LOGITS, P(temperature=0.5)), p / p.sum())


def test_greedy_is_one_hot():
    assert final_probs(LOGITS, P(temperature=0)).tolist() == [1, 0, 0, 0, 0]


def test_top_k():
    assert torch.allclose(final_probs(LOGITS, P(temperature=1.0, top_k=2)),
                          torch.tensor([5 / 7, 2 / 7, 0, 0, 0], dtype=torch.float64))


def test_top_p_keeps_smallest_set_reaching_p():
    # cumulative: 0.5, 0.7, 0.85 -> top_p=0.7 keeps {0,1}; 0.71 keeps {0,1,2}
    assert torch.allclose(final_probs(LOGITS, P(temperature=1.0, top_p=0.7)),
                          torch.tensor([5 / 7, 2 / 7, 0, 0, 0], dtype=torch.float64))
    assert torch.allclose(final_probs(LOGITS, P(temperature=1.0, top_p=0.71)),
                          torch.tensor([0.5, 0.2, 0.15, 0, 0], dtype=torch.float64) / 0.85)


def test_min_p_relative_to_top():
    # threshold 0.3 * 0.5 = 0.15 keeps {0.5, 0.2, 0.15}
    assert torch.allclose(final_probs(LOGITS, P(temperature=1.0, min_p=0.3)),
                          torch.tensor([0.5, 0.2, 0.15, 0, 0], dtype=torch.float64) / 0.85)


def test_batched_rows_are_independent():
    rows = torch.stack([LOGITS, LOGITS.flip(0)])
    out = final_probs(rows, P(temperature=1.0, top_k=1))
    assert out.tolist() == [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


def test_seeded_sampling_is_reproducible():
    probs = final_probs(LOGITS, P(temperature=1.0))
    a = [sample(probs, g) for g in [make_generator(7)] for _ in range(50)]
    g = make_generator(7)
    b = [sample(probs, g) for _ in range(50)]
    assert a == b
    g2 = make_generator(8)
    assert [sample(probs, g2) for _ in range(50)] != a


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(temperature=math.inf), dict(temperature=math.nan),
                                dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=-0.1),
                                dict(min_p=1.1), dict(max_new_tokens=0), dict(temperature="hot"),
                                dict(top_k=1.5), dict(stop=("",)), dict(temperature=10 ** 400),
                                dict(temperature=True), dict(top_k=True), dict(top_p=math.nan),
                                dict(min_p=math.inf), dict(max_new_tokens=2.0)])
def test_invalid_params_raise_clear_errors(kw):
    with pytest.raises(SpecdecError) as e:
        P(**kw)
    name = list(kw)[0]
    assert name in str(e.value)
    if name in SAMPLING_BOUNDS:  # the message says what the field accepts
        assert SAMPLING_BOUNDS[name].requirement in str(e.value)


# ---------------------------------------------------------------- extreme values

ROWS = torch.tensor([[2.0, -1.0, 0.5, 3.5, 3.0, -40.0, 0.0, 1.0],
                     [-30.0, 12.0, 11.5, 0.0, -float("inf"), 7.0, 11.9, -3.0]])
TINY = [1e-39, 1e-46, 5e-324]  # below float32's normal range, below its subnormals, the smallest double
EXTREMES = [
    {"temperature": t} for t in TINY + [1e-300, 1e-10, 1e10, 1e308, 1.7976931348623157e308]
] + [
    {"temperature": 1.0, "top_p": p} for p in [5e-324, 1e-46, 1e-39, 1e-7, 0.9999999999999999]
] + [
    {"temperature": 1.0, "min_p": m} for m in [5e-324, 1e-300, 1e-7, 0.9999999999999999, 1.0]
] + [
    {"temperature": 1.0, "top_k": k} for k in [1, 7, 8, 9, 2 ** 63, 10 ** 30]
] + [
    {"temperature": 5e-324, "top_p": 5e-324, "min_p": 1.0, "top_k": 1},
    {"temperature": 1e308, "top_p": 5e-324, "min_p": 5e-324, "top_k": 10 ** 30},
    {"temperature": 1e308, "top_k": 2},
    {"temperature": 1e-39, "top_p": 0.5, "min_p": 0.5, "top_k": 3},
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kw", EXTREMES, ids=[str(kw) for kw in EXTREMES])
def test_extreme_values_give_a_distribution(kw, dtype):
    """Every value validate() accepts: finite, non-negative rows summing to 1, and the most
    probable token always keeps mass."""
    probs = final_probs(ROWS.to(dtype), P(**kw))
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(2, dtype=probs.dtype))
    assert (probs.gather(-1, ROWS.argmax(-1, keepdim=True)) > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", TINY + [1e-300])
def test_tiny_temperature_is_the_argmax(temperature, dtype):
    """T -> 0+: all mass on the argmax, where logits / T overflows."""
    want = torch.nn.functional.one_hot(ROWS.argmax(-1), ROWS.shape[-1]).to(dtype)
    assert torch.equal(final_probs(ROWS.to(dtype), P(temperature=temperature)), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_temperature_splits_ties(dtype):
    logits = torch.tensor([1.0, 4.0, -2.0, 4.0, 3.9999], dtype=dtype)
    for temperature in TINY:
        assert final_probs(logits, P(temperature=temperature)).tolist() == [0, 0.5, 0, 0.5, 0]
        # min_p = 1 keeps exactly the tokens tied for the maximum
        assert final_probs(logits, P(temperature=1.0, min_p=1.0)).tolist() == [0, 0.5, 0, 0.5, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 1e-30])
def test_tiny_top_p_keeps_the_most_probable_token(top_p, dtype):
    """1e-46 and 5e-324 round to 0 in float32, which used to drop every token (NaN)."""
    want = torch.nn.functional.one_hot(ROWS.argmax(-1), ROWS.shape[-1]).to(dtype)
    assert torch.equal(final_probs(ROWS.to(dtype), P(temperature=1.0, top_p=top_p)), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", [1e30, 1e308, 1.7976931348623157e308])
def test_huge_temperature_is_uniform_over_what_the_filters_keep(temperature, dtype):
    logits = ROWS[:1].to(dtype)  # no -inf in this row
    n = logits.shape[-1]
    assert torch.allclose(final_probs(logits, P(temperature=temperature)), torch.full((1, n), 1 / n, dtype=dtype))
    # top-k still keeps the k largest logits, not every token the division made equal
    top2 = final_probs(logits, P(temperature=temperature, top_k=2))
    assert top2.tolist() == [[0, 0, 0, 0.5, 0.5, 0, 0, 0]]


def test_filters_at_their_limits_are_no_filter():
    base = final_probs(ROWS, P(temperature=0.7))
    for kw in [{"top_k": 2 ** 63}, {"top_k": ROWS.shape[-1]}, {"min_p": 5e-324}, {"top_p": 1.0}]:
        assert torch.allclose(final_probs(ROWS, P(temperature=0.7, **kw)), base), kw


def test_bounds_accept_exactly_their_range():
    top_p, top_k, temperature = SAMPLING_BOUNDS["top_p"], SAMPLING_BOUNDS["top_k"], SAMPLING_BOUNDS["temperature"]
    assert [top_p.accepts(v) for v in (5e-324, 1, 1.0, 0.0, 1.0000000000000002, True, "0.5", 10 ** 400, math.nan)] \
        == [True, True, True, False, False, False, False, False, False]
    assert [top_k.accepts(v) for v in (0, 2 ** 70, -1, 1.0, False)] == [True, True, False, False, False]
    assert [temperature.accepts(v) for v in (0, 1.7976931348623157e308, -5e-324, math.inf, 10 ** 400)] \
        == [True, True, False, False, False]
    assert [b.requirement for b in SAMPLING_BOUNDS.values()] == [
        "a finite number >= 0", "an integer >= 0 (0 = off)", "a number in (0, 1]", "a number in [0, 1]",
        "an integer >= 1", "a number in [-2, 2]", "a number in [-2, 2]", "a finite number > 0 (1 = off)"]


def test_sample_draws_each_token_with_its_probability_and_never_a_zero():
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(0)
    probs = torch.zeros(700)  # three blocks of sample()'s first level, the last one short
    probs[[0, 255, 256, 400, 699]] = torch.tensor([0.1, 0.25, 0.05, 0.4, 0.2])
    draws = torch.tensor([sample(probs * 3.0, g) for _ in range(6_000)])  # any scale
    assert set(draws.tolist()) <= {0, 255, 256, 400, 699}
    counts = torch.bincount(draws, minlength=700)[[0, 255, 256, 400, 699]]
    assert chisquare(counts.numpy(), (probs[[0, 255, 256, 400, 699]] * 6_000).numpy()).pvalue > 1e-3
    one = torch.zeros(151_936)
    one[-1] = 1e-30  # a lone tiny mass at the very end
    assert sample(one, g) == 151_935
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    big = torch.softmax(torch.randn(151_936, generator=g), 0)
    assert [sample(big, a) for _ in range(5)] == [sample(big, b) for _ in range(5)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_greedy_token_is_the_first_largest_logit_in_any_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = (torch.randn(151936, generator=g) * 4).to(dtype)
        assert greedy_token(logits) == int(logits.argmax())
    rows = (torch.randn(5, 151936, generator=g) * 4).to(dtype)
    assert torch.equal(greedy_tokens(rows), rows.argmax(-1))
    ties = torch.zeros(1000, dtype=dtype)
    ties[[700, 300, 999]] = 2.0  # torch's argmax gives the first of equal maxima
    assert greedy_token(ties) == 300
    if dtype == torch.float64:  # not narrowed: a difference below float32's precision still decides
        close = torch.tensor([1.0, 1.0 + 1e-12], dtype=dtype)
        assert greedy_token(close) == 1
