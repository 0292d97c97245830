"""Seeded drafter-invariant sampling (specdec/sampling/seeded.py): the race samples the target's
distribution (chi-square, also through the engine on a tiny model, with a power check), the
verifier's output does not depend on what was drafted (every draft enumerated), and with a
seed every method gives plain sampling's tokens, in bfloat16 on the shipped models too."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

import specdec
import specdec.sampling.seeded
from specdec.data.prompts import build_suite
from specdec.errors import SpecdecError
from specdec.models.bundled import DEFAULT_TARGET
from specdec.sampling import SamplingParams, draw_distinct
from specdec.sampling.seeded import PositionNoise, race
from specdec.spec.verify import tree_depths, verify_choices, verify_tree_choices

from distribution import N_QUICK, p_value, tiny_model_dir
from enumerate import RandomLM

PROMPTS = [p.text[-400:] for p in build_suite(7)][:20]
FIXED_BUDGET = {"draft": 4, "ngram": 4, "medusa": 16, "eagle": 16}


def test_race_samples_the_distribution_and_never_a_zero():
    p = torch.tensor([0.4, 0.25, 0.0, 0.15, 0.1, 0.06, 0.04])
    counts = torch.zeros(len(p))
    n = 20_000
    for seed in range(n):
        counts[PositionNoise(seed, len(p)).samples(p[None], [5])[0]] += 1
    assert counts[2] == 0
    keep = p > 0
    assert chisquare(counts[keep].numpy(), (p[keep] * n).numpy()).pvalue > 1e-3


def test_positions_get_independent_noise():
    """Two positions, the second's distribution depending on the first token: the joint must
    be the product of the conditionals (noise shared between positions would correlate them)."""
    first = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    second = {a: torch.tensor(row, dtype=torch.float64)
              for a, row in enumerate([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [1 / 3] * 3])}
    n = 12_000
    counts = {}
    for seed in range(n):
        noise = PositionNoise(seed, 3)
        a = noise.samples(first[None], [10])[0]
        b = noise.samples(second[a][None], [11])[0]
        counts[a, b] = counts.get((a, b), 0) + 1
    keys = list(itertools.product(range(3), range(3)))
    expected = [float(first[a] * second[a][b]) * n for a, b in keys]
    assert chisquare([counts.get(k, 0) for k in keys], expected).pvalue > 1e-3


def test_noise_depends_on_seed_and_position_only():
    a, b = PositionNoise(7, 50), PositionNoise(7, 50, cache_positions=1)
    b.exponentials(3)  # evicted from b's cache below: recomputed identically
    b.exponentials(4)
    assert torch.equal(a.exponentials(3), b.exponentials(3))
    assert not torch.equal(a.exponentials(3), a.exponentials(4))
    assert not torch.equal(a.exponentials(3), PositionNoise(8, 50).exponentials(3))
    assert not torch.equal(PositionNoise(-1, 50).exponentials(0), PositionNoise(1, 50).exponentials(0))
    assert (a.exponentials(3) > 0).all()


@pytest.mark.parametrize("lm_seed", range(4))
def test_chain_output_is_the_plain_output_for_every_draft(lm_seed):
    """A step verifies any drafts (every sequence of up to 3 tokens over a 3-token vocabulary)
    against the target rows after them; the tokens it emits are always a prefix-extension of
    what plain seeded sampling emits at those positions."""
    lm, start = RandomLM(lm_seed, sparse=True), 5
    for seed in range(5):
        noise = PositionNoise(seed, 3)
        plain = []
        for t in range(4):
            plain.append(noise.samples(lm(tuple(plain))[None], [start + t])[0])
        for k in range(4):
            for drafts in itertools.product(range(3), repeat=k):
                rows = torch.stack([lm(tuple(drafts[:i])) for i in range(k + 1)])
                verdict = verify_choices(list(drafts), noise.samples(rows, list(range(start, start + k + 1))))
                emitted = list(drafts[:verdict.num_accepted]) + [verdict.next_token]
                assert emitted == plain[:len(emitted)]


def test_tree_output_is_the_plain_output_for_every_tree():
    """The same for trees: every tree of depth <= 2 with up to 2 children per node (siblings
    distinct) over a 3-token vocabulary, each node's row the target's after its path."""
    lm, start = RandomLM(11, sparse=False), 2
    shapes = [[], [-1], [-1, -1], [-1, 0], [-1, -1, 0], [-1, 0, 0], [-1, -1, 0, 1], [-1, -1, 1, 1]]
    for seed in range(4):
        noise = PositionNoise(seed, 3)
        plain = []
        for t in range(3):
            plain.append(noise.samples(lm(tuple(plain))[None], [start + t])[0])
        for parents in shapes:
            for tokens in itertools.product(range(3), repeat=len(parents)):
                paths, ok = [()], True
                for i, p in enumerate(parents):
                    paths.append(paths[p + 1] + (tokens[i],))
                for i, j in itertools.combinations(range(len(parents)), 2):
                    ok &= not (parents[i] == parents[j] and tokens[i] == tokens[j])
                if not ok:
                    continue
                rows = torch.stack([lm(path) for path in paths])
                positions = [start + d for d in [0] + tree_depths(parents)]
                verdict = verify_tree_choices(list(tokens), parents, noise.samples(rows, positions))
                emitted = [tokens[i] for i in verdict.path] + [verdict.next_token]
                assert emitted == plain[:len(emitted)]


def test_draws_with_noise_lead_with_the_race_winner():
    torch.manual_seed(0)
    q = torch.softmax(torch.randn(3, 200) * 3, -1)
    noise = PositionNoise(5, 200)
    exponentials = noise.rows([4, 4, 9])
    drawn, drawn_from = draw_distinct(q, 3, None, support=64, exponentials=exponentials)
    again, _ = draw_distinct(q, 3, None, support=64, exponentials=exponentials)
    assert drawn == again  # deterministic: no generator needed
    assert [row[0] for row in drawn] == race(drawn_from, exponentials).tolist()
    assert all(len(set(row)) == 3 for row in drawn)


def test_seed_mode_is_checked_and_only_applies_with_a_seed():
    with pytest.raises(SpecdecError, match="seed_mode must be one of invariant, rejection"):
        SamplingParams(seed_mode="gumbel")
    assert SamplingParams(temperature=1.0, seed=3).drafter_invariant
    assert not SamplingParams(temperature=1.0, seed=3, seed_mode="rejection").drafter_invariant
    assert not SamplingParams(temperature=1.0).drafter_invariant  # no seed: rejection sampling
    assert not SamplingParams(seed=3).drafter_invariant  # greedy is deterministic anyway


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return (tiny_model_dir(tmp_path_factory.mktemp("t"), seed=1, scale=1.0),
            tiny_model_dir(tmp_path_factory.mktemp("d"), seed=2, scale=3.0))


def test_seeded_draft_sampling_has_the_target_distribution(tiny_pair):
    target, draft = tiny_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK, seed_mode="invariant") > 1e-3


def test_noise_shared_across_positions_fails_the_same_test(tiny_pair, monkeypatch):
    original = PositionNoise.exponentials
    monkeypatch.setattr(specdec.sampling.seeded.PositionNoise, "exponentials", lambda self, position: original(self, 0))
    target, draft = tiny_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK, seed_mode="invariant") < 1e-3


def test_a_draft_equal_to_the_target_is_always_accepted():
    """The drafter races with the target's noise: with q = p (float64) every draft is the
    target's own choice. With independent noise it would be accepted with probability sum p^2."""
    decoder = specdec.load(target=DEFAULT_TARGET, draft=DEFAULT_TARGET, method="draft", dtype="float64",
                           draft_tokens=4)
    stats = decoder.generate(PROMPTS[0], temperature=1.0, seed=1, max_new_tokens=24, ignore_eos=True).stats
    assert stats.drafted_tokens > 0 and stats.accepted_tokens == stats.drafted_tokens
    rejection = decoder.generate(PROMPTS[0], temperature=1.0, seed=1, seed_mode="rejection", max_new_tokens=24,
                                 ignore_eos=True).stats
    assert rejection.accepted_tokens == rejection.drafted_tokens  # p/q = 1 there too


@pytest.fixture(scope="module")
def plain_bf16():
    return {}, specdec.load(dtype="bfloat16")


def seeded_divergences(plain_bf16, method: str, prompts: list[str], tokens: int, draft_tokens: int | None,
                       exact: bool = True) -> int:
    cache, plain = plain_bf16
    decoder = specdec.load(method=method, dtype="bfloat16", draft_tokens=draft_tokens, exact=exact)
    diverged = 0
    for i, prompt in enumerate(prompts):
        for temperature in (0.7, 1.0):
            kw = dict(temperature=temperature, seed=i, max_new_tokens=tokens, ignore_eos=True)
            if (prompt, temperature, tokens) not in cache:
                cache[prompt, temperature, tokens] = plain.generate(prompt, **kw).token_ids
            diverged += decoder.generate(prompt, **kw).token_ids != cache[prompt, temperature, tokens]
    return diverged


@pytest.mark.parametrize("method", ["draft", "ngram", "medusa", "eagle"])
def test_every_method_gives_plain_seeded_output_in_bfloat16(plain_bf16, method):
    assert seeded_divergences(plain_bf16, method, PROMPTS[:4], 32, FIXED_BUDGET[method]) == 0
    assert seeded_divergences(plain_bf16, method, PROMPTS[4:6], 32, None) == 0  # adaptive K


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "ngram", "medusa", "eagle"])
def test_every_method_gives_plain_seeded_output_20_prompts(plain_bf16, method):
    assert seeded_divergences(plain_bf16, method, PROMPTS, 64, FIXED_BUDGET[method]) == 0
