"""Presence, frequency and repetition penalties and logit bias: the vectorised adjustment
against a plain-Python reference, extreme values, validation, and greedy identity with
penalties for every method (tiny models, and the bundled models in float64). Sampled
losslessness is proven in test_verify_exact.py / test_tree_verify.py (enumeration) and
test_end_to_end_stats.py (chi-square)."""
import pytest
import torch

import specdec
from specdec.errors import SpecdecError
from specdec.sampling import SAMPLING_BOUNDS, SamplingParams, final_probs
from specdec.sampling.penalties import TokenHistory, adjust_logits, chain_paths, tree_paths

from distribution import reference_penalized
from helpers import SAMPLE_TEXT, make_eagle_dir, make_medusa_dir, make_model_dir

V = 12
SETTINGS = [
    dict(presence_penalty=1.5),
    dict(frequency_penalty=-0.7),
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.4),
    dict(logit_bias={0: -100, 5: 2.5, 11: 100}),
    dict(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1.3, logit_bias={3: -1.0}),
]


@pytest.mark.parametrize("kw", SETTINGS, ids=[str(kw) for kw in SETTINGS])
def test_adjusted_rows_match_the_reference(kw):
    """Each row of one batched adjustment equals the reference applied to that row's own
    history: the prompt, the output so far, and the row's path (drafts or tree ancestors)."""
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, **kw)
    prompt, output = [1, 2, 2, 7], [3, 3, 9]
    tokens, parents = [4, 3, 9, 4, 4], [-1, -1, 0, 2, 1]
    history = TokenHistory(params, prompt, V)
    history.extend(output[:2])
    history.extend(output[2:])
    for paths in (chain_paths([3, 4, 4, 10]), tree_paths(tokens, parents)):
        logits = torch.randn(len(paths), V, generator=g, dtype=torch.float64) * 3
        got = adjust_logits(logits, params, history.rows(paths))
        want = torch.stack([reference_penalized(row, params, prompt, output + path)
                            for row, path in zip(logits, paths)])
        assert torch.allclose(got, want, atol=1e-12), (got - want).abs().max()
        assert not torch.equal(got, logits)  # the setting does something on these rows


def test_paths():
    assert chain_paths([5, 6]) == [[], [5], [5, 6]]
    assert tree_paths([5, 6, 7, 8], [-1, -1, 0, 2]) == [[], [5], [6], [5, 7], [5, 7, 8]]


def test_greedy_takes_the_argmax_of_the_adjusted_logits():
    logits = torch.tensor([[3.0, 2.9, 0.0, -1.0]])
    params = SamplingParams(presence_penalty=0.5)
    history = TokenHistory(params, [1], 4)
    assert final_probs(logits, params, history.rows([[]])).tolist() == [[1, 0, 0, 0]]
    history.extend([0])  # token 0 generated once: 3.0 - 0.5 < 2.9
    assert final_probs(logits, params, history.rows([[]])).tolist() == [[0, 1, 0, 0]]
    assert final_probs(logits, params, TokenHistory(params, [1], 4).rows([[0]])).tolist() == [[0, 1, 0, 0]]


def test_penalized_params_need_a_history():
    with pytest.raises(ValueError, match="history"):
        final_probs(torch.zeros(3), SamplingParams(temperature=1.0, frequency_penalty=0.1))


ROWS = torch.tensor([[2.0, -1.0, 0.5, 3.5, 3.0, -40.0, 0.0, 1.0, 0.0, 5.0, -3.0, 2.0],
                     [-30.0, 12.0, 11.5, 0.0, -3.0, 7.0, 11.9, -3.0, 1.0, 1.0, 0.0, 0.0]])
EXTREMES = [dict(repetition_penalty=r) for r in (5e-324, 1e-300, 1e-39, 1e300, 1.7976931348623157e308)] + [
    dict(presence_penalty=2, frequency_penalty=2, repetition_penalty=1e308, logit_bias={t: -100 for t in range(V)}),
    dict(presence_penalty=-2, frequency_penalty=-2, repetition_penalty=5e-324, logit_bias={3: 100, 4: 100}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1e-30, 1.0, 1e30])
@pytest.mark.parametrize("kw", EXTREMES, ids=[str(kw)[:60] for kw in EXTREMES])
def test_extreme_values_give_a_distribution(kw, temperature, dtype):
    """Every value validate() accepts gives finite, non-negative rows summing to 1, with
    every token of the prompt and the output penalised."""
    params = SamplingParams(temperature=temperature, **kw)
    history = TokenHistory(params, list(range(V)), V)
    history.extend([0, 0, 5, 9])
    probs = final_probs(ROWS.to(dtype), params, history.rows([[], [9, 9]]))
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(2, dtype=probs.dtype))


@pytest.mark.parametrize("kw,name", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(frequency_penalty=-2.0000001), "frequency_penalty"), (dict(frequency_penalty="1"), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(repetition_penalty=True), "repetition_penalty"),
    (dict(logit_bias={1: 101}), "logit_bias"), (dict(logit_bias={"1": 1}), "logit_bias"),
    (dict(logit_bias={-1: 1}), "logit_bias"), (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(logit_bias=[(1, 1.0), (1, 2.0)]), "logit_bias"), (dict(logit_bias=5), "logit_bias"),
])
def test_bad_values_name_the_field(kw, name):
    with pytest.raises(SpecdecError, match=name):
        SamplingParams(**kw)
    if name in SAMPLING_BOUNDS and not isinstance(kw[name], str):
        with pytest.raises(SpecdecError) as e:
            SamplingParams(**kw)
        assert SAMPLING_BOUNDS[name].requirement in str(e.value)


def test_logit_bias_is_stored_as_sorted_pairs():
    params = SamplingParams(logit_bias={7: 1, 2: -3.5})
    assert params.logit_bias == ((2, -3.5), (7, 1.0)) and params.penalized
    assert hash(params) == hash(SamplingParams(logit_bias=[(7, 1.0), (2, -3.5)]))
    assert not SamplingParams(logit_bias={}).penalized


# ---------------------------------------------------------------- through the engine

@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("t"), layers=2, kv_heads=1, max_pos=256)
    # the target drafting for itself: every draft is accepted, so the rows after accepted
    # drafts (whose counts include them) decide the output
    return target, {"draft": target, "ngram": None, "medusa": make_medusa_dir(tmp_path_factory.mktemp("m"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("e"), target)}


PENALIZED = dict(presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.4, logit_bias={5: 1.5, 9: -2.0})


def test_plain_decoding_with_penalties_matches_a_reference_loop(dirs):
    """Greedy plain decoding with penalties = argmax of the reference-penalised logits of a
    full forward pass, one token at a time (the engine's counts are kept incrementally)."""
    target, _ = dirs
    decoder = specdec.load(target=target, dtype="float64")
    model = decoder.engine.target.model
    params = SamplingParams(**PENALIZED)
    prompt = decoder.tokenizer.encode("def add(a, b):\n    return a + b\n")
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(30):
            logits = model(torch.tensor([ids]))[0, -1]
            ids.append(int(reference_penalized(logits, params, prompt, ids[len(prompt):]).argmax()))
    got = decoder.generate(prompt, max_new_tokens=30, ignore_eos=True, **PENALIZED)
    assert got.token_ids == ids[len(prompt):]
    assert got.token_ids != decoder.generate(prompt, max_new_tokens=30, ignore_eos=True).token_ids


@pytest.mark.parametrize("method", ["draft", "ngram", "medusa", "eagle"])
def test_greedy_identity_with_penalties(dirs, method):
    target, drafters = dirs
    plain = specdec.load(target=target, dtype="float64")
    # the draft (the target's own weights) alone: a prompt-lookup branch beside it may be rejected
    spec = specdec.load(target=target, draft=drafters[method], method=method, dtype="float64",
                        draft_tokens=4 if method in ("draft", "ngram") else 8, tree_lookup=method != "draft")
    drafted = accepted = 0
    for prompt in ["def add(a, b):", "".join(SAMPLE_TEXT[:4]), "x"]:  # the long one: prompt lookup finds matches
        want = plain.generate(prompt, max_new_tokens=40, **PENALIZED)
        got = spec.generate(prompt, max_new_tokens=40, **PENALIZED)
        assert got.token_ids == want.token_ids
        drafted += got.stats.drafted_tokens
        accepted += got.stats.accepted_tokens
    assert drafted > 0
    if method == "draft":
        assert accepted == drafted


def test_logit_bias_outside_the_vocabulary_is_refused(dirs):
    target, _ = dirs
    decoder = specdec.load(target=target)
    with pytest.raises(SpecdecError, match="outside the vocabulary"):
        decoder.generate("def", logit_bias={decoder.vocab_size: 1.0})


def test_penalties_have_their_own_controllers(dirs):
    target, drafters = dirs
    engine = specdec.load(target=target, draft=drafters["draft"], method="draft").engine
    plain = engine.controller_for(SamplingParams(temperature=1.0))
    assert engine.controller_for(SamplingParams(temperature=1.0)) is plain
    assert engine.controller_for(SamplingParams(temperature=1.0, presence_penalty=1.0)) is not plain
    assert engine.controller_for(SamplingParams(temperature=1.0, logit_bias={1: 2})) is not plain
    assert engine.controller_for(SamplingParams(temperature=1.0, logprobs=3)) is plain  # no effect on acceptance


FIXED_BUDGET = {"draft": 4, "ngram": 4, "medusa": 16, "eagle": 16}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(FIXED_BUDGET))
def test_greedy_identity_with_penalties_on_bundled_models(method):
    """The trained bundled family (long accepted drafts, so the drafts' counts matter), float64."""
    from specdec.data.prompts import build_suite

    prompts = [p.text[-300:] for p in build_suite(7)][:4]
    plain = specdec.load(dtype="float64")
    spec = specdec.load(method=method, dtype="float64", draft_tokens=FIXED_BUDGET[method])
    accepted = 0
    for prompt in prompts:
        want = plain.generate(prompt, max_new_tokens=48, **PENALIZED)
        got = spec.generate(prompt, max_new_tokens=48, **PENALIZED)
        assert got.token_ids == want.token_ids
        accepted += got.stats.accepted_tokens
    assert accepted > 0
