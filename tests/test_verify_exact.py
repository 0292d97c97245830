"""Exact proof by enumeration (float64): one verification step, followed by plain target
sampling, yields exactly the target's joint distribution over the next K+1 tokens; also with
penalties, whose rows are built the way the engine builds them (one TokenHistory, a path per
row), against the penalised model defined one prefix at a time."""
import itertools

import pytest
import torch

from specdec.sampling import SamplingParams, final_probs
from specdec.sampling.penalties import TokenHistory, chain_paths
from specdec.spec.verify import verify_greedy, verify_rejection

from distribution import PenalizedLM
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
                from specdec.spec.verify import ChainVerdict
                return ChainVerdict(i, rng.categorical(target_probs[i]))
        from specdec.spec.verify import ChainVerdict
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


# ---------------------------------------------------------------- penalties

PENALTIES = [
    dict(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.7),
    dict(temperature=0.8, repetition_penalty=1.6, logit_bias={2: 0.5}),
    dict(temperature=1.0, top_k=2, presence_penalty=-0.5, frequency_penalty=1.5, repetition_penalty=0.7),
]
PROMPT = (0, 1)  # token 1 is in the prompt: the repetition penalty applies to it from the start
GENERATED = (2,)  # already generated before this step: presence/frequency apply to it


def penalized_step(target: RandomLM, draft, params: SamplingParams, k: int, paths=chain_paths) -> dict:
    """Like spec_step_distribution, with every row penalised through ONE TokenHistory of the
    context and a path per row (paths(drafts)), as the engine and the draft model do."""
    ctx = PROMPT + GENERATED
    history = TokenHistory(params, list(PROMPT), V)
    history.extend(list(GENERATED))
    want = PenalizedLM(target, params, PROMPT)

    def rows(lm: RandomLM, seq: tuple, n: int) -> torch.Tensor:
        logits = torch.stack([lm(ctx + seq[:i]).log() for i in range(n)])
        return final_probs(logits, params, history.rows(paths(list(seq))[:n]))

    if isinstance(draft, RandomLM):
        draft_seqs = list(itertools.product(range(V), repeat=k))
    else:
        draft_seqs = [tuple(draft(ctx))]
    out = {}
    for seq in draft_seqs:
        draft_probs = rows(draft, seq, k) if isinstance(draft, RandomLM) else None
        q_seq = float(torch.prod(draft_probs[torch.arange(k), list(seq)])) if draft_probs is not None else 1.0
        if q_seq == 0:
            continue
        target_probs = rows(target, seq, k + 1)

        def emitted_tokens(rng, seq=seq, draft_probs=draft_probs, target_probs=target_probs) -> tuple:
            verdict = verify_rejection(list(seq), draft_probs, target_probs, rng)
            return seq[:verdict.num_accepted] + (verdict.next_token,)

        for emitted, prob in enumerate_outcomes(emitted_tokens).items():
            rest = k + 1 - len(emitted)
            for tail, p_tail in joint(want, ctx + emitted, rest).items() if rest else [((), 1.0)]:
                key = emitted + tail
                out[key] = out.get(key, 0.0) + q_seq * prob * p_tail
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("kw", PENALTIES, ids=[str(kw) for kw in PENALTIES])
def test_penalized_rejection_sampling_is_exact(kw, k):
    """Drafts sampled from the penalised draft, verified against the penalised target: the
    output is the penalised target's joint."""
    params = SamplingParams(**kw)
    target, draft = RandomLM(1, True, V), RandomLM(2, False, V)
    want = joint(PenalizedLM(target, params, PROMPT), PROMPT + GENERATED, k + 1)
    assert_same(penalized_step(target, draft, params, k), want)
    assert_same(penalized_step(target, lambda ctx: [1, 2, 2][:k], params, k), want)  # deterministic drafts


def test_the_penalties_change_the_target():
    """The cases above are not vacuous: penalised and plain joints differ."""
    target = RandomLM(1, True, V)
    for kw in PENALTIES:
        params = SamplingParams(**kw)
        plain = joint(PenalizedLM(target, SamplingParams(temperature=kw["temperature"], top_k=kw.get("top_k", 0)),
                                  PROMPT), PROMPT + GENERATED, 3)
        penalized = joint(PenalizedLM(target, params, PROMPT), PROMPT + GENERATED, 3)
        assert max(abs(plain[x] - penalized[x]) for x in plain) > 0.01


def test_rows_that_ignore_the_drafts_are_caught():
    """Power check: counting only the context (not the drafts before each row) is biased."""
    params = SamplingParams(**PENALTIES[0])
    target, draft = RandomLM(1, True, V), RandomLM(2, False, V)
    want = joint(PenalizedLM(target, params, PROMPT), PROMPT + GENERATED, 3)
    ignore_drafts = lambda drafts: [[] for _ in range(len(drafts) + 1)]  # noqa: E731
    with pytest.raises(AssertionError):
        assert_same(penalized_step(target, draft, params, 2, ignore_drafts), want, tol=1e-3)
