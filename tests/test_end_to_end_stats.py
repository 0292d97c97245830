"""End-to-end statistics for the chain methods: speculative sampling through the real engine
reproduces the target's exact joint distribution of the first tokens (chi-square), and the
same test rejects a wrong verifier. The exactness itself is proven by enumeration in
test_verify_exact.py; this checks the wiring (caches, rollback, draft distributions). With
penalties the exact joint is computed one prefix at a time by the plain-Python reference, so
a drafter or verifier that counts the wrong tokens at some row shows here too (power check
included); one tree method is covered as well."""
import pytest

import specdec
import specdec.engine.verdicts
from specdec.spec.verify import ChainVerdict

from distribution import N_QUICK, N_SLOW, NEW, PROMPT, p_value, tiny_model_dir
from helpers import make_eagle_dir, make_medusa_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = tiny_model_dir(tmp_path_factory.mktemp("t"), seed=1, scale=0.5)  # broad distributions
    draft = tiny_model_dir(tmp_path_factory.mktemp("d"), seed=1, scale=0.35)  # related, not equal
    return target, draft


@pytest.fixture(scope="module")
def sharp_dirs(tmp_path_factory):
    """A confident draft that disagrees with the target: many rejections, and a verifier that
    mishandles q shows within a few thousand samples."""
    return (tiny_model_dir(tmp_path_factory.mktemp("st"), seed=1, scale=1.0),
            tiny_model_dir(tmp_path_factory.mktemp("sd"), seed=2, scale=3.0))


def test_draft_sampling_matches_target_with_many_rejections(sharp_dirs):
    target, draft = sharp_dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK) > 1e-3


def test_a_wrong_verifier_fails_the_same_test(sharp_dirs, monkeypatch):
    def wrong_verifier(drafts, draft_probs, target_probs, rng):  # forgets to divide by q
        for i, x in enumerate(drafts):
            if not rng.coin(float(target_probs[i, x])):
                return ChainVerdict(i, rng.categorical(target_probs[i]))
        return ChainVerdict(len(drafts), rng.categorical(target_probs[len(drafts)]))

    monkeypatch.setattr(specdec.engine.verdicts, "verify_rejection", wrong_verifier)
    target, draft = sharp_dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK) < 1e-3


def test_ngram_sampling_matches_target(dirs):
    target, _ = dirs
    decoder = specdec.load(target=target, method="ngram", draft_tokens=2)
    assert p_value(decoder, target, dict(temperature=0.7, top_k=6, top_p=0.9), N_QUICK) > 1e-3
    assert decoder.generate([1, 2, 3, 1, 2], max_new_tokens=2, seed=0, ignore_eos=True).stats.drafted_tokens > 0


SLOW_CASES = [
    ("draft", dict(temperature=1.0)),
    ("draft", dict(temperature=0.7)),
    ("draft", dict(temperature=1.0, top_k=5, top_p=0.9)),
    ("draft", dict(temperature=0.7, top_p=0.8)),
    ("ngram", dict(temperature=1.0)),
    ("ngram", dict(temperature=0.7)),
    ("ngram", dict(temperature=1.0, top_k=4)),
    ("ngram", dict(temperature=0.7, top_k=6, top_p=0.9)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,params_kw", SLOW_CASES, ids=[f"{m}-{p}" for m, p in SLOW_CASES])
def test_speculative_sampling_matches_target_distribution(dirs, method, params_kw):
    target, draft = dirs
    decoder = specdec.load(target=target, draft=draft if method == "draft" else None, method=method,
                           draft_tokens=2)
    assert p_value(decoder, target, params_kw, N_SLOW) > 1e-3


# ---------------------------------------------------------------- penalties

# strong enough that a row counting the wrong tokens shifts the joint visibly
PENALIZED = dict(temperature=1.0, presence_penalty=1.5, frequency_penalty=1.0, repetition_penalty=1.3,
                 logit_bias={3: 1.0})


@pytest.fixture(scope="module")
def head_dirs(dirs, tmp_path_factory):
    target, _ = dirs
    return {"medusa": make_medusa_dir(tmp_path_factory.mktemp("medusa"), target),
            "eagle": make_eagle_dir(tmp_path_factory.mktemp("eagle"), target)}


def test_penalized_draft_sampling_matches_target(dirs):
    target, draft = dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, PENALIZED, N_QUICK) > 1e-3


def test_penalized_tree_sampling_matches_target(dirs, head_dirs):
    target, _ = dirs
    decoder = specdec.load(target=target, draft=head_dirs["medusa"], method="medusa", draft_tokens=12)
    assert p_value(decoder, target, PENALIZED, N_QUICK) > 1e-3
    assert decoder.generate(PROMPT, max_new_tokens=NEW, seed=0, **PENALIZED).stats.drafted_tokens > 0


def test_counts_that_ignore_the_drafts_fail_the_same_test(dirs, monkeypatch):
    """Power check: the target's rows penalised for the context only, not for the drafts
    before each row."""
    monkeypatch.setattr(specdec.engine.verdicts, "chain_paths", lambda drafts: [[] for _ in range(len(drafts) + 1)])
    target, draft = dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, PENALIZED, N_QUICK) < 1e-3


PENALIZED_SLOW = [
    ("draft", dict(temperature=0.7, top_k=6, presence_penalty=-1.0, frequency_penalty=2.0)),
    ("ngram", PENALIZED),
    ("ngram", dict(temperature=1.0, repetition_penalty=0.6, logit_bias={1: -2.0, 5: 2.0})),
    ("medusa", dict(temperature=0.8, top_p=0.9, presence_penalty=2.0, repetition_penalty=1.5)),
    ("eagle", PENALIZED),
    ("eagle", dict(temperature=1.0, frequency_penalty=-1.5, logit_bias={2: 3.0})),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,params_kw", PENALIZED_SLOW, ids=[f"{m}-{p}" for m, p in PENALIZED_SLOW])
def test_penalized_sampling_matches_target_distribution(dirs, head_dirs, method, params_kw):
    target, draft = dirs
    drafter = {"draft": draft, "ngram": None, **head_dirs}[method]
    budget = {"draft": 2, "ngram": 2, "medusa": 12, "eagle": 8}[method]
    decoder = specdec.load(target=target, draft=drafter, method=method, draft_tokens=budget)
    assert p_value(decoder, target, params_kw, N_SLOW) > 1e-3
    assert decoder.generate(PROMPT, max_new_tokens=NEW, seed=0, **params_kw).stats.drafted_tokens > 0
