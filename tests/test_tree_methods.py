"""Medusa and EAGLE through the real engine: greedy identity and chi-square on tiny random
models with random heads."""
import pytest
import torch

import specdec
import specdec.engine
from specdec.verify import verify_tree_sampling

from helpers import make_eagle_dir, make_medusa_dir, make_model_dir
from test_end_to_end_stats import N_SAMPLES, NEW, PROMPT, V, chi_square_p, exact_joint, sample_counts
from specdec.sampling import SamplingParams


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    kw = dict(vocab_size=V, tokenizer="char", hidden_size=16, layers=1, heads=2, kv_heads=1, max_pos=32)
    target = make_model_dir(tmp_path_factory.mktemp("t"), seed=1, scale=0.5, **kw)  # broad distributions
    medusa = make_medusa_dir(tmp_path_factory.mktemp("medusa"), target)
    eagle = make_eagle_dir(tmp_path_factory.mktemp("eagle"), target)
    return target, {"medusa": medusa, "eagle": eagle}


@pytest.fixture(scope="module")
def text_dirs(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("tt"), layers=2, kv_heads=1, max_pos=256)
    return target, {"medusa": make_medusa_dir(tmp_path_factory.mktemp("tm"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("te"), target)}


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_greedy_identity_float64(text_dirs, method):
    target, heads = text_dirs
    plain = specdec.load(target=target, dtype="float64")
    spec = specdec.load(target=target, draft=heads[method], method=method, dtype="float64")
    for prompt in ["def add(a, b):", "class Point:", "for i in range(10):", "x"]:
        want = plain.generate(prompt, max_new_tokens=40)
        got = spec.generate(prompt, max_new_tokens=40)
        assert got.token_ids == want.token_ids
        assert got.stats.target_forwards <= want.stats.target_forwards


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_self_consistent_streaming(text_dirs, method):
    target, heads = text_dirs
    spec = specdec.load(target=target, draft=heads[method], method=method)
    chunks = list(spec.stream("def add", temperature=0.9, seed=2, max_new_tokens=30))
    assert "".join(c.text for c in chunks) == chunks[-1].result.text
    assert len(chunks[-1].result.token_ids) == 30


CASES = [("medusa", dict(temperature=1.0)), ("medusa", dict(temperature=0.7, top_k=5)),
         ("eagle", dict(temperature=1.0)), ("eagle", dict(temperature=0.7, top_p=0.9))]


FIXED_NODES = {"medusa": 12, "eagle": 8}  # every step verifies a full tree


@pytest.mark.slow
@pytest.mark.parametrize("method,params_kw", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_tree_sampling_matches_target_distribution(dirs, method, params_kw):
    target, heads = dirs
    decoder = specdec.load(target=target, draft=heads[method], method=method, draft_tokens=FIXED_NODES[method])
    counts = sample_counts(decoder, params_kw, N_SAMPLES)
    p = chi_square_p(counts, exact_joint(target, SamplingParams(**params_kw)))
    assert p > 1e-3, p
    assert decoder.generate(PROMPT, max_new_tokens=NEW, seed=0, **params_kw).stats.drafted_tokens > 0


def test_a_tree_verifier_told_the_wrong_draft_distribution_fails(dirs, monkeypatch):
    """Power check: the same test catches a verifier that uses a q other than the one the
    tree's tokens were drawn from."""
    def wrong_q(tokens, parents, target_probs, rng, draft_probs=None, draws=None):
        return verify_tree_sampling(tokens, parents, target_probs, rng, torch.full_like(draft_probs, 1 / V), draws)

    monkeypatch.setattr(specdec.engine, "verify_tree_sampling", wrong_q)
    target, heads = dirs
    decoder = specdec.load(target=target, draft=heads["eagle"], method="eagle", draft_tokens=FIXED_NODES["eagle"])
    counts = sample_counts(decoder, dict(temperature=1.0), N_SAMPLES // 4)
    p = chi_square_p(counts, exact_joint(target, SamplingParams(temperature=1.0)))
    assert p < 1e-3, p


def test_typical_acceptance_is_opt_in_and_labelled_lossy(text_dirs):
    target, heads = text_dirs
    with pytest.raises(specdec.SpecdecError, match="tree methods"):
        specdec.load(target=target, method="ngram", typical_acceptance=True)
    lossless = specdec.load(target=target, draft=heads["medusa"], method="medusa")
    assert not lossless.generate("def", temperature=0.8, seed=0, max_new_tokens=8).stats.lossy
    lossy = specdec.load(target=target, draft=heads["medusa"], method="medusa", typical_acceptance=True)
    r = lossy.generate("def", temperature=0.8, seed=0, max_new_tokens=8)
    assert r.stats.lossy and len(r.token_ids) == 8
    assert not lossy.generate("def", temperature=0, max_new_tokens=8).stats.lossy  # greedy stays exact
