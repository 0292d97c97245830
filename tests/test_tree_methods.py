"""Medusa and EAGLE through the real engine: greedy identity and chi-square on tiny random
models with random heads."""
import pytest
import torch

import specdec
import specdec.engine.verdicts
from specdec.spec.verify import verify_tree_sampling

from distribution import N_QUICK, N_SLOW, NEW, PROMPT, V, p_value, tiny_model_dir
from helpers import make_eagle_dir, make_medusa_dir, make_model_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = tiny_model_dir(tmp_path_factory.mktemp("t"), seed=1, scale=0.5)  # broad distributions
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
    """Random heads: drafts are mostly rejected, so this covers the rejection paths (the
    bundled models' trained heads cover long accepted paths in test_bundled.py)."""
    target, heads = text_dirs
    plain = specdec.load(target=target, dtype="float64")
    spec = specdec.load(target=target, draft=heads[method], method=method, dtype="float64", draft_tokens=8)
    for prompt in ["def add(a, b):", "class Point:", "for i in range(10):", "x"]:
        want = plain.generate(prompt, max_new_tokens=40)
        got = spec.generate(prompt, max_new_tokens=40)
        assert got.token_ids == want.token_ids
        # every step verified a tree (but the first after a one-token prompt: no features yet)
        assert got.stats.num_drafts == got.stats.target_forwards - (prompt == "x")


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_self_consistent_streaming(text_dirs, method):
    target, heads = text_dirs
    spec = specdec.load(target=target, draft=heads[method], method=method)
    chunks = list(spec.stream("def add", temperature=0.9, seed=2, max_new_tokens=30))
    assert "".join(c.text for c in chunks) == chunks[-1].result.text
    assert len(chunks[-1].result.token_ids) == 30


FIXED_NODES = {"medusa": 12, "eagle": 8}  # every step verifies a full tree
QUICK_CASES = [("medusa", dict(temperature=0.7, top_k=5)), ("eagle", dict(temperature=1.0))]
SLOW_CASES = [("medusa", dict(temperature=1.0)), ("eagle", dict(temperature=0.7, top_p=0.9))]


def check_tree_sampling(dirs, method: str, params_kw: dict, n: int) -> None:
    target, heads = dirs
    decoder = specdec.load(target=target, draft=heads[method], method=method, draft_tokens=FIXED_NODES[method])
    assert p_value(decoder, target, params_kw, n) > 1e-3
    assert decoder.generate(PROMPT, max_new_tokens=NEW, seed=0, **params_kw).stats.drafted_tokens > 0


@pytest.mark.parametrize("method,params_kw", QUICK_CASES, ids=[f"{m}-{p}" for m, p in QUICK_CASES])
def test_tree_sampling_matches_target_distribution(dirs, method, params_kw):
    check_tree_sampling(dirs, method, params_kw, N_QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("method,params_kw", QUICK_CASES + SLOW_CASES,
                         ids=[f"{m}-{p}" for m, p in QUICK_CASES + SLOW_CASES])
def test_tree_sampling_matches_target_distribution_closely(dirs, method, params_kw):
    check_tree_sampling(dirs, method, params_kw, N_SLOW)


def test_a_tree_verifier_told_the_wrong_draft_distribution_fails(dirs, monkeypatch):
    """Power check: the same test catches a verifier that uses a q other than the one the
    tree's tokens were drawn from."""
    def wrong_q(tokens, parents, target_probs, rng, draft_probs=None, draws=None):
        return verify_tree_sampling(tokens, parents, target_probs, rng, torch.full_like(draft_probs, 1 / V), draws)

    monkeypatch.setattr(specdec.engine.verdicts, "verify_tree_sampling", wrong_q)
    target, heads = dirs
    decoder = specdec.load(target=target, draft=heads["eagle"], method="eagle", draft_tokens=FIXED_NODES["eagle"])
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK) < 1e-3


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


def test_eagle_trees_with_lookup_chains_fit_the_end_of_the_cache(text_dirs):
    """A greedy tree may hold a lookup chain beyond its node budget (up to tree_floor nodes):
    budgets leave room for it, up to the last row of a short cache; output as plain decoding's."""
    target, heads = text_dirs
    prompt = "def add(a, b):\n    return a + b\n" * 2
    plain = specdec.load(target=target, dtype="float64", max_len=64)
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", dtype="float64", max_len=64,
                        draft_tokens=2)
    want = plain.generate(prompt, max_new_tokens=200, ignore_eos=True)
    got = spec.generate(prompt, max_new_tokens=200, ignore_eos=True)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason == "length"
    assert max(got.stats.draft_tokens_per_step) > 2  # some trees held more than their budget
