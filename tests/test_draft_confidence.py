"""A draft model stops its chain where its confidence (its probability of all its drafts so far)
falls below its controller's break-even (spec/proposers/draft_model.py propose's floor,
spec/control/draft_length.py confidence_floor): where drafting wins the controller hands it the
whole cap and the draft's own probabilities size the chain. Greedy output stays plain decoding's,
and sampled output the target's distribution, whatever the drafts' lengths."""
import math
import random
from dataclasses import replace

import pytest
from test_controller import record, simulate

import specdec
from specdec.models.checkpoint import load_native
from specdec.models.runner import NativeRunner
from specdec.sampling import SamplingParams
from specdec.spec.control.draft_length import GAMMAS, ConfidenceCalibration, DraftLengthController
from specdec.spec.proposers.draft_model import DraftModelProposer

from distribution import PROMPT, chi_square_p, exact_joint, tiny_model_dir
from helpers import make_model_dir


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    return load_native(make_model_dir(tmp_path_factory.mktemp("d"), tokenizer="char", vocab_size=24, scale=0.5),
                       "float64")


def test_a_draft_stops_once_its_confidence_falls_below_the_floor(draft_model):
    context = [3, 5, 7, 3, 5]
    greedy = SamplingParams(temperature=0.0)

    def drafts(floor):
        proposer = DraftModelProposer(NativeRunner(draft_model))
        proposer.reset(context)
        return proposer.propose(context, 6, greedy, None, floor=floor)

    whole = drafts(0.0)
    conf = whole.confidences
    assert len(whole.tokens) == len(conf) == 6
    assert all(0 < b <= a <= 1 for a, b in zip([1.0] + conf, conf))  # a product of probabilities
    assert conf[-1] < 0.99  # the tiny draft is unsure: the floors below do cut its chain
    assert drafts(1.0).tokens == whole.tokens[:1]  # the first draft is always made
    for i in range(1, 6):
        if conf[i] < conf[i - 1]:
            cut = drafts(conf[i] * 1.0001)  # just above the confidence after draft i: stops there
            assert cut.tokens == whole.tokens[:i + 1] and cut.confidences == conf[:i + 1]
    unasked = DraftModelProposer(NativeRunner(draft_model))
    unasked.reset(context)
    plain = unasked.propose(context, 6, greedy, None)  # no floor: k drafts, no confidences computed
    assert plain.tokens == whole.tokens and plain.confidences is None


def test_a_floor_of_one_drafts_without_guess_rows(draft_model):
    """A floor of 1 ends the chain at its first draft short of certain: prompt lookup's guesses, which
    the draft checks in the rows after its own (Guesser), would be rows computed for nothing."""
    context = [3, 5, 7, 3, 5, 7, 3, 5]  # repeats: the guesser has guesses to offer
    greedy = SamplingParams(temperature=0.0)

    def drafting_widths(floor):
        proposer = DraftModelProposer(NativeRunner(draft_model))
        proposer.reset(context)
        widths = []
        extend = proposer.runner.extend

        def counted(tokens, *args, want_logits=True, **kwargs):
            if want_logits:  # a drafting pass (the prompt's read asks for none)
                widths.append(len(tokens))
            return extend(tokens, *args, want_logits=want_logits, **kwargs)
        proposer.runner.extend = counted
        return proposer.propose(context, 6, greedy, None, floor=floor).tokens, widths

    first, widths = drafting_widths(1.0)
    assert widths == [1] * len(first)
    assert max(drafting_widths(0.0)[1]) > 1  # below 1 the guesses ride along


def test_a_stopping_controller_hands_the_whole_cap_and_prices_one_more_draft():
    c = DraftLengthController(max_k=8, stops_at_floor=True)
    assert c.confidence_floor() == 0.0  # no costs yet: no stop
    simulate(c, 0.8, lambda k: 1.0 + 0.05 * k, 0.1, steps=200)
    assert c.choose(16) == 8 and c.choose(5) == 5  # drafting wins: the cap
    floor = c.confidence_floor()
    a = c.acceptance
    rate = c.drafting_rate  # tokens a second of its drafted steps: 1 + kept drafts over their seconds
    assert 0.8 * 3.0 / (1.4 + 0.8) < rate < 1.2 * 5.0 / (1.4 + 0.8)  # K = 8 steps: ~3.5 tokens in ~2.2 s
    row = (c.target_time(8) - c.target_time(1)) / 7  # a verified row's seconds, on its cost line
    chance = (c.draft_seconds_per_token + row) * rate / a
    assert floor == pytest.approx(chance ** (1 / c.calibration.gamma), rel=1e-6)
    cheaper = DraftLengthController(max_k=8, stops_at_floor=True)
    simulate(cheaper, 0.8, lambda k: 1.0 + 0.05 * k, 0.02, steps=200)
    assert cheaper.confidence_floor() < floor  # a cheaper draft drafts on at lower confidence
    useless = DraftLengthController(max_k=8, stops_at_floor=True)
    simulate(useless, 0.0, lambda k: 1.0 + 0.05 * k, 0.2, steps=200)
    assert sum(useless.choose(16) == 0 for _ in range(20)) >= 18  # the gate still turns drafting off
    assert DraftLengthController(fixed_k=4, stops_at_floor=True).confidence_floor() is None  # K drafts
    assert DraftLengthController(max_k=8).confidence_floor() is None


@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_the_calibration_finds_how_a_drafts_confidence_reads(gamma):
    """Drafts whose confidences P are kept with chance P ** gamma: the fitted exponent is gamma."""
    rng = random.Random(0)
    calibration = ConfidenceCalibration()
    for _ in range(400):
        confidences, p = [], 1.0
        for _ in range(5):
            p *= rng.uniform(0.3, 1.0)
            confidences.append(p)
        accepted = 0
        while accepted < 5 and rng.random() < (confidences[accepted] / (confidences[accepted - 1] if accepted
                                                                          else 1.0)) ** gamma:
            accepted += 1
        calibration.observe(tuple(confidences), accepted)
    assert calibration.gamma == gamma
    assert calibration.confidence_for(0.5) == pytest.approx(0.5 ** (1 / gamma))
    assert set(GAMMAS) >= {0.3, 1.0}


def test_the_controller_learns_the_calibration_from_its_steps():
    c = DraftLengthController(max_k=8, stops_at_floor=True)
    c.observe(replace(record(8, 3, 1, 1.0, 0.3, 0.0), confidences=(0.9, 0.5, 0.2)))
    d = c.calibration.decay  # draft 1 kept, drafts 2 and 3 not: each exponent's log-likelihood
    expected = [d * d * g * math.log(0.9) + d * math.log1p(-0.5 ** g) + math.log1p(-0.2 ** g) for g in GAMMAS]
    assert c.calibration.log_likelihood == pytest.approx(expected)
    c.observe(record(8, 3, 1, 1.0, 0.3, 0.0))  # a step without confidences (the drafter had no floor)
    assert c.calibration.log_likelihood == pytest.approx(expected)


def test_greedy_output_with_stopped_drafts_is_plain_decodings(tmp_path, monkeypatch):
    target = make_model_dir(tmp_path / "t", tokenizer="char", vocab_size=24, seed=1, scale=0.5)
    draft = make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, seed=1, scale=2.0)
    monkeypatch.setattr(DraftLengthController, "confidence_floor", lambda self: 0.1)
    monkeypatch.setattr(DraftLengthController, "choose", lambda self, limit, **kw: min(limit, 5))
    plain = specdec.load(target=target, dtype="float64", calibrate=False)
    drafted = specdec.load(target=target, draft=draft, method="draft", dtype="float64", calibrate=False)
    lengths = set()
    for prompt in ("abcabc", "hello wor", "dcba"):
        want = plain.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids
        got = drafted.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert got.token_ids == want
        lengths |= set(got.stats.draft_tokens_per_step)
    assert len(lengths - {0, 5}) >= 2  # the floor cut chains at several lengths


def test_sampled_drafts_stopped_by_confidence_keep_the_target_distribution(tmp_path, monkeypatch):
    """Three tokens sampled, the first two counted against the target's exact joint: the first
    step drafts one or two tokens as the first draft's probability falls below the floor or not."""
    target = tiny_model_dir(tmp_path / "t", seed=1, scale=0.5)
    draft = tiny_model_dir(tmp_path / "d", seed=1, scale=0.35)
    monkeypatch.setattr(DraftLengthController, "confidence_floor", lambda self: 0.15)
    monkeypatch.setattr(DraftLengthController, "choose", lambda self, limit, **kw: min(limit, 2))
    decoder = specdec.load(target=target, draft=draft, method="draft", calibrate=False)
    counts, first_steps = {}, set()
    for seed in range(3000):
        result = decoder.generate(PROMPT, max_new_tokens=3, seed=seed, temperature=1.0, ignore_eos=True)
        first_two = tuple(result.token_ids[:2])
        counts[first_two] = counts.get(first_two, 0) + 1
        first_steps.add(result.stats.draft_tokens_per_step[0])
    assert first_steps == {1, 2}
    assert chi_square_p(counts, exact_joint(target, SamplingParams(temperature=1.0))) > 1e-3


def test_few_drafts_leave_the_calibration_near_its_prior_and_it_is_remembered():
    calibration = ConfidenceCalibration()
    calibration.observe((0.9, 0.8), 0)  # one confidently wrong draft alone does not say gamma = 1
    assert calibration.gamma == 0.5
    before = list(calibration.log_likelihood)
    calibration.observe((float("nan"),), 0)  # no evidence, and no NaN in the fit
    assert calibration.log_likelihood == before
    c = DraftLengthController(max_k=8, stops_at_floor=True)
    for _ in range(60):  # drafts kept as P ** 1: sure drafts lost far more often than P ** 0.5 says
        c.observe(replace(record(8, 2, 0, 1.0, 0.2, 0.0), confidences=(0.5, 0.25)))
        c.observe(replace(record(8, 2, 2, 1.0, 0.2, 0.0), confidences=(0.5, 0.25)))
    gamma = c.calibration.gamma
    assert gamma > 0.5
    later = DraftLengthController(max_k=8, stops_at_floor=True)
    later.recall(c.memory())
    assert later.calibration.gamma == gamma
    older = c.memory()
    del older["calibration"]  # a memory written before the calibration existed
    DraftLengthController(max_k=8, stops_at_floor=True).recall(older)
    with pytest.raises(ValueError):
        DraftLengthController(max_k=8).recall({**c.memory(), "calibration": [0.0, 1.0]})
