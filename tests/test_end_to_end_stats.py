"""End-to-end statistics: speculative sampling through the real engine and tiny random models
reproduces the target's exact joint distribution of the first tokens (chi-square)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import specdec
import specdec.engine
from specdec.sampling import SamplingParams, final_probs
from specdec.verify import ChainVerdict

from helpers import make_model_dir

V = 8
N_SAMPLES = 20_000
NEW = 2
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive, so prompt lookup always has a proposal


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    kw = dict(vocab_size=V, tokenizer="char", hidden_size=16, layers=1, heads=2, kv_heads=1, max_pos=32)
    target = make_model_dir(tmp_path_factory.mktemp("t"), seed=1, scale=0.5, **kw)  # broad distributions
    draft = make_model_dir(tmp_path_factory.mktemp("d"), seed=1, scale=0.35, **kw)  # related, not equal
    return target, draft


def exact_joint(target_dir, params: SamplingParams) -> dict:
    model = specdec.load(target=target_dir, dtype="float64").engine.target.model
    out = {}
    with torch.no_grad():
        first = final_probs(model(torch.tensor([PROMPT]))[0, -1], params)
        for a in range(V):
            second = final_probs(model(torch.tensor([PROMPT + [a]]))[0, -1], params)
            for b in range(V):
                out[(a, b)] = float(first[a] * second[b])
    return out


def sample_counts(decoder, params_kw: dict, n: int) -> dict:
    decoder.engine.eos_ids = set()  # the exact joint treats token 0 as an ordinary token
    counts: dict = {}
    for seed in range(n):
        ids = tuple(decoder.generate(PROMPT, max_new_tokens=NEW, seed=seed, **params_kw).token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    return counts


def chi_square_p(counts: dict, joint: dict) -> float:
    n = sum(counts.values())
    assert set(counts) <= {k for k, p in joint.items() if p > 0}, "sampled an impossible sequence"
    keys = sorted(joint, key=lambda k: -joint[k])
    obs, exp = [], []
    tail_o = tail_e = 0.0
    for k in keys:
        e = joint[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0)), exp.append(e)
        else:
            tail_o += counts.get(k, 0)
            tail_e += e
    if tail_e > 0:
        obs.append(tail_o), exp.append(tail_e)
    assert len(obs) >= 10, "degenerate test: the target distribution has too few outcomes"
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return float(chisquare(obs, exp).pvalue)


CASES = [
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
@pytest.mark.parametrize("method,params_kw", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_speculative_sampling_matches_target_distribution(dirs, method, params_kw):
    target, draft = dirs
    decoder = specdec.load(target=target, draft=draft if method == "draft" else None, method=method,
                           draft_tokens=2)
    counts = sample_counts(decoder, params_kw, N_SAMPLES)
    p = chi_square_p(counts, exact_joint(target, SamplingParams(**params_kw)))
    assert p > 1e-3, p


@pytest.fixture(scope="module")
def sharp_dirs(tmp_path_factory):
    """Peaked target and an unrelated draft: many rejections, so a verifier bug shows."""
    kw = dict(vocab_size=V, tokenizer="char", hidden_size=16, layers=1, heads=2, kv_heads=1, max_pos=32)
    return (make_model_dir(tmp_path_factory.mktemp("st"), seed=1, scale=1.5, **kw),
            make_model_dir(tmp_path_factory.mktemp("sd"), seed=2, scale=1.5, **kw))


def test_the_correct_verifier_passes_with_many_rejections(sharp_dirs):
    target, draft = sharp_dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    counts = sample_counts(decoder, dict(temperature=1.0), N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, SamplingParams(temperature=1.0))) > 1e-3


def test_a_wrong_verifier_fails_the_same_test(sharp_dirs, monkeypatch):
    def wrong_verifier(drafts, draft_probs, target_probs, rng):  # forgets to divide by q
        for i, x in enumerate(drafts):
            if not rng.coin(float(target_probs[i, x])):
                return ChainVerdict(i, rng.categorical(target_probs[i]))
        return ChainVerdict(len(drafts), rng.categorical(target_probs[len(drafts)]))

    monkeypatch.setattr(specdec.engine, "verify_rejection", wrong_verifier)
    target, draft = sharp_dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    counts = sample_counts(decoder, dict(temperature=1.0), N_SAMPLES)
    assert chi_square_p(counts, exact_joint(target, SamplingParams(temperature=1.0))) < 1e-3
