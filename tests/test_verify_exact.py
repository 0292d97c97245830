"""Exact proof by enumeration (float64): one verification step, followed by plain target
sampling, yields exactly the target's joint distribution over the next K+1 tokens."""
import itertools

import pytest
import torch

from specdec.verify import verify_greedy, verify_rejection

from enumerate import RandomLM, enumerate_outcomes

V = 3


def joint(lm: RandomLM, prefix: tuple, n: int) -> dict:
    out = {}
    for seq in itertools.product(range(V), repeat=n):
        prob, ctx = 1.0, prefix
        for t in seq:
            prob *= float(lm(ctx)[t])
            ctx = ctx + (t,)
        out[seq] = prob
    return out


def spec_step_distribution(target: RandomLM, draft, k: int, verifier) -> dict:
    """Distribution of the first k+1 output tokens: one speculative step, completed by plain
    sampling from the target. draft: RandomLM (sampled drafts) or a function prefix -> tokens."""
    ctx = (0,)
    if isinstance(draft, RandomLM):
        draft_seqs = [(seq, joint(draft, ctx, k)[seq]) for seq in itertools.product(range(V), repeat=k)]
    else:
        draft_seqs = [(tuple(draft(ctx)), 1.0)]
    out = {}
    for seq, q_seq in draft_seqs:
        if q_seq == 0:
            continue
        prefixes = [ctx + seq[:i] for i in range(k + 1)]
        target_probs = torch.stack([target(p) for p in prefixes])
        draft_probs = torch.stack([draft(p) for p in prefixes[:k]]) if isinstance(draft, RandomLM) else None
        def emitted_tokens(rng, seq=seq, draft_probs=draft_probs, target_probs=target_probs) -> tuple:
            verdict = verifier(list(seq), draft_probs, target_probs, rng)
            return seq[:verdict.num_accepted] + (verdict.next_token,)

        outcomes = enumerate_outcomes(emitted_tokens)
        for emitted, prob in outcomes.items():
            rest = k + 1 - len(emitted)
            for tail, p_tail in joint(target, ctx + emitted, rest).items() if rest else [((), 1.0)]:
                key = emitted + tail
                out[key] = out.get(key, 0.0) + q_seq * prob * p_tail
    return out


def assert_same(got: dict, want: dict, tol: float = 1e-9) -> None:
    keys = set(got) | set(want)
    worst = max(abs(got.get(x, 0.0) - want.get(x, 0.0)) for x in keys)
    assert worst < tol, worst


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("sparse", [False, True])
def test_rejection_sampling_is_exact_with_sampled_drafts(k, sparse):
    target, draft = RandomLM(1, sparse, V), RandomLM(2, sparse, V)
    assert_same(spec_step_distribution(target, draft, k, verify_rejection), joint(target, (0,), k + 1))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_rejection_sampling_is_exact_with_deterministic_drafts(k):
    target = RandomLM(3, sparse=True, vocab_size=V)
    drafts = lambda ctx: [(len(ctx) + i) % V for i in range(k)]  # e.g. prompt lookup
    assert_same(spec_step_distribution(target, drafts, k, verify_rejection), joint(target, (0,), k + 1))


def test_a_wrong_verifier_is_caught():
    """Accepting with probability p instead of min(1, p/q) is biased: the test must see it."""
    def wrong(draft_tokens, draft_probs, target_probs, rng):
        for i, x in enumerate(draft_tokens):
            if not rng.coin(float(target_probs[i, x])):
                from specdec.verify import ChainVerdict
                return ChainVerdict(i, rng.categorical(target_probs[i]))
        from specdec.verify import ChainVerdict
        return ChainVerdict(len(draft_tokens), rng.categorical(target_probs[-1]))

    target, draft = RandomLM(1, vocab_size=V), RandomLM(2, vocab_size=V)
    got = spec_step_distribution(target, draft, 2, wrong)
    want = joint(target, (0,), 3)
    assert max(abs(got[x] - want[x]) for x in want) > 1e-3


def test_greedy_verifier_keeps_argmax_prefix():
    probs = torch.eye(4, dtype=torch.float64)[[2, 1, 3, 0]]
    v = verify_greedy([2, 1, 0], probs)
    assert (v.num_accepted, v.next_token) == (2, 3)
    v = verify_greedy([2, 1, 3], probs)
    assert (v.num_accepted, v.next_token) == (3, 0)
    v = verify_greedy([], probs)
    assert (v.num_accepted, v.next_token) == (0, 2)
