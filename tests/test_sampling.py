import math

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, final_probs, make_generator, sample


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
                                dict(top_k=1.5), dict(stop=("",))])
def test_invalid_params_raise_clear_errors(kw):
    with pytest.raises(SpecdecError) as e:
        P(**kw)
    assert list(kw)[0] in str(e.value) or "stop" in str(e.value)
