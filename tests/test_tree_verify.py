"""Exact proof by enumeration (float64) for the tree verifier, plus tree utilities. With
penalties, the target's rows are built as the engine builds them (one TokenHistory, each
node's path), against the penalised model defined one prefix at a time."""
import random

import pytest
import torch

from specdec.sampling import SamplingParams, final_probs
from specdec.sampling.penalties import TokenHistory, tree_paths
from specdec.spec.proposers.draft_vocab import expand_logits
from specdec.spec.verify import tree_attention_mask, tree_depths, verify_tree_greedy, verify_tree_sampling

from distribution import PenalizedLM
from enumerate import RandomLM, enumerate_outcomes

V = 5


def random_tree(seed: int, width: int, depth: int):
    """Random tree with up to `width` distinct-token children per node, up to `depth` levels."""
    rnd = random.Random(seed)
    tokens, parents = [], []
    frontier = [-1]
    for _ in range(depth):
        new = []
        for node in frontier:
            for t in rnd.sample(range(V), rnd.randint(0 if node >= 0 else 1, width)):
                tokens.append(t)
                parents.append(node)
                new.append(len(tokens) - 1)
        frontier = new
    return tokens, parents


def LM(seed: int, sparse: bool = False) -> RandomLM:
    return RandomLM(seed, sparse, vocab_size=V, power=3)


def node_prefix(i, tokens, parents):
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return tuple(reversed(out))


def completions(target, ctx, emitted: dict, depth: int) -> dict:
    """Distribution of the first `depth` tokens: emitted prefixes completed by target sampling."""
    out = {}
    stack = list(emitted.items())
    while stack:
        seq, pr = stack.pop()
        if len(seq) >= depth:
            out[seq[:depth]] = out.get(seq[:depth], 0.0) + pr
            continue
        for t, pt in enumerate(target(ctx + seq).tolist()):
            if pt > 0:
                stack.append((seq + (t,), pr * pt))
    return out


def assert_matches_target(target, ctx, emitted: dict, depth: int) -> None:
    got = completions(target, ctx, emitted, depth)
    want = completions(target, ctx, {(): 1.0}, depth)
    keys = set(got) | set(want)
    assert max(abs(got.get(k, 0) - want.get(k, 0)) for k in keys) < 1e-9
    first = {}
    for seq, pr in got.items():
        first[seq[0]] = first.get(seq[0], 0) + pr
    assert all(abs(first.get(t, 0) - float(target(ctx)[t])) < 1e-9 for t in range(V))


def emitted_tokens(tokens, verdict):
    return tuple(tokens[i] for i in verdict.path) + (verdict.next_token,)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("sparse", [False, True])
def test_tree_sampling_next_token_is_exact(seed, sparse):
    """First emitted token and the full emitted sequence (completed by target sampling) follow
    the target exactly, for random trees of width <= 4 and depth <= 3."""
    tokens, parents = random_tree(seed, width=4, depth=3)
    target = LM(seed, sparse)
    ctx = (0,)
    rows = [target(ctx)] + [target(ctx + node_prefix(i, tokens, parents)) for i in range(len(tokens))]
    probs = torch.stack(rows)
    outcomes = enumerate_outcomes(lambda rng: emitted_tokens(tokens, verify_tree_sampling(tokens, parents, probs, rng)))
    assert_matches_target(target, ctx, outcomes, max(tree_depths(parents)) + 1)


def sampled_tree_step(rng, target, draft, ctx, seed, widths=(2, 2), claimed_draft=None, target_rows=None):
    """Draw a fixed number of children per expanded node from the draft without replacement
    through `rng` (so enumeration covers the draws too), leave some drawn tokens out of the
    tree, verify. claimed_draft: the q handed to the verifier, if not the true one.
    target_rows(tokens, parents): the target's rows, if not target(prefix) per node."""
    tokens, parents, q_rows, draws = [], [], {}, {}
    frontier = [-1]
    for width in widths:
        new = []
        for node in frontier[:2]:
            prefix = ctx + node_prefix(node, tokens, parents)
            q = draft(prefix)
            left, seq = q.clone(), []
            while len(seq) < width and left.sum() > 0:
                x = rng.categorical(left / left.sum())
                seq.append(x)
                left[x] = 0.0
            q_rows[node] = (claimed_draft or draft)(prefix)
            draws[node] = seq
            for x in seq:
                if hash((seed, prefix, x)) % 4 != 0:  # some drawn tokens stay out of the tree
                    tokens.append(x)
                    parents.append(node)
                    new.append(len(tokens) - 1)
        frontier = new
    target_probs = (target_rows(tokens, parents) if target_rows is not None else
                    torch.stack([target(ctx)] + [target(ctx + node_prefix(i, tokens, parents))
                                                 for i in range(len(tokens))]))
    draft_probs = torch.stack([q_rows.get(i, torch.zeros(V, dtype=torch.float64)) for i in range(-1, len(tokens))])
    draw_lists = [draws.get(i, []) for i in range(-1, len(tokens))]
    return emitted_tokens(tokens, verify_tree_sampling(tokens, parents, target_probs, rng, draft_probs, draw_lists))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sparse", [False, True])
def test_sampled_tree_is_exact(seed, sparse):
    """Children drawn from a draft distribution without replacement (some drawn tokens left out
    of the tree): the emitted tokens follow the target exactly, over draws and verification."""
    target, draft = LM(seed, sparse), LM(seed + 100, not sparse)
    ctx = (0,)
    outcomes = enumerate_outcomes(lambda rng: sampled_tree_step(rng, target, draft, ctx, seed))
    assert_matches_target(target, ctx, outcomes, 3)


class ReducedVocabLM:
    """A draft over a reduced vocabulary as EAGLE's reduced head gives it: its own
    distribution over the `d2t` tokens, expanded to -inf logits elsewhere (zero probability)."""

    def __init__(self, seed: int, d2t: list[int]):
        self.lm, self.d2t = RandomLM(seed, vocab_size=len(d2t), power=3), torch.tensor(d2t)

    def __call__(self, prefix: tuple) -> torch.Tensor:
        return final_probs(expand_logits(self.lm(prefix).log(), self.d2t, V), SamplingParams(temperature=1.0))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("d2t", [[0, 2, 3], [4]])
def test_reduced_draft_vocabulary_is_exact(seed, d2t):
    """A draft that can never propose some tokens the target gives mass to (dense target, draft
    zero outside d2t): the emitted tokens still follow the target exactly."""
    target, draft = LM(seed), ReducedVocabLM(seed + 100, d2t)
    ctx = (0,)
    assert all(float(target(ctx)[t]) > 0 for t in range(V) if t not in d2t)  # mass the draft cannot reach
    assert all(float(draft(ctx)[t]) == 0 for t in range(V) if t not in d2t)
    outcomes = enumerate_outcomes(lambda rng: sampled_tree_step(rng, target, draft, ctx, seed))
    assert_matches_target(target, ctx, outcomes, 3)


def test_sampled_tree_with_the_wrong_draft_distribution_is_caught():
    """The same check fails when the verifier is told a q other than the one drawn from."""
    target, draft, other = LM(1), LM(2), LM(3)
    ctx = (0,)
    outcomes = enumerate_outcomes(lambda rng: sampled_tree_step(rng, target, draft, ctx, 1, claimed_draft=other))
    with pytest.raises(AssertionError):
        assert_matches_target(target, ctx, outcomes, 3)


def test_tree_greedy_follows_argmax():
    tokens = [1, 2, 3, 4]
    parents = [-1, -1, 1, 1]  # root -> {1, 2}; node1(2) -> {3, 4}
    probs = torch.zeros(5, V, dtype=torch.float64)
    probs[0, 2] = 1  # root: argmax 2 -> node 1
    probs[2, 4] = 1  # node 1: argmax 4 -> node 3
    probs[4, 0] = 1  # node 3: argmax 0 -> not in tree
    v = verify_tree_greedy(tokens, parents, probs)
    assert v.path == [1, 3] and v.next_token == 0


def test_tree_mask_and_depths():
    parents = [-1, -1, 0, 2]
    assert tree_depths(parents) == [1, 1, 2, 3]
    m = tree_attention_mask(parents).int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 0, 1, 0, 0],
                 [1, 1, 0, 1, 0],
                 [1, 1, 0, 1, 1]]


# ---------------------------------------------------------------- penalties

PENALTY = SamplingParams(temperature=1.0, presence_penalty=1.2, frequency_penalty=0.6, repetition_penalty=1.4,
                         logit_bias={3: 0.7})
PROMPT, GENERATED = (0, 1), (2,)


def penalized_rows(lm: RandomLM, params: SamplingParams, paths=tree_paths):
    """target_rows for a tree: every node's row from one TokenHistory of the context and the
    node's path, as the engine computes them."""
    ctx = PROMPT + GENERATED
    history = TokenHistory(params, list(PROMPT), V)
    history.extend(list(GENERATED))

    cache = {}

    def rows(tokens, parents):
        key = (tuple(tokens), tuple(parents))
        if key not in cache:
            logits = torch.stack([lm(ctx).log()] + [lm(ctx + node_prefix(i, tokens, parents)).log()
                                                    for i in range(len(tokens))])
            cache[key] = final_probs(logits, params, history.rows(paths(tokens, parents)))
        return cache[key]
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sparse", [False, True])
def test_penalized_tree_verification_is_exact(seed, sparse):
    """Deterministic candidates: the emitted tokens follow the penalised target exactly."""
    tokens, parents = random_tree(seed, width=3, depth=3)
    lm = LM(seed, sparse)
    probs = penalized_rows(lm, PENALTY)(tokens, parents)
    outcomes = enumerate_outcomes(lambda rng: emitted_tokens(tokens, verify_tree_sampling(tokens, parents, probs, rng)))
    assert_matches_target(PenalizedLM(lm, PENALTY, PROMPT), PROMPT + GENERATED, outcomes,
                          max(tree_depths(parents)) + 1)


@pytest.mark.parametrize("seed,sparse", [(0, False), (1, True)])
def test_penalized_sampled_tree_is_exact(seed, sparse):
    """Children drawn from the penalised draft without replacement, verified against the
    penalised target's rows: exact over draws and verification."""
    lm = LM(seed, sparse)
    target, draft = PenalizedLM(lm, PENALTY, PROMPT), PenalizedLM(LM(seed + 100, not sparse), PENALTY, PROMPT)
    rows = penalized_rows(lm, PENALTY)
    outcomes = enumerate_outcomes(lambda rng: sampled_tree_step(rng, target, draft, PROMPT + GENERATED, seed,
                                                                target_rows=rows))
    assert_matches_target(target, PROMPT + GENERATED, outcomes, 3)


def test_penalized_rows_that_ignore_the_ancestors_are_caught():
    """Power check: counting only the context, not each node's path, is biased."""
    lm = LM(1)
    target, draft = PenalizedLM(lm, PENALTY, PROMPT), PenalizedLM(LM(101), PENALTY, PROMPT)
    ignore_paths = lambda tokens, parents: [[] for _ in range(len(tokens) + 1)]  # noqa: E731
    rows = penalized_rows(lm, PENALTY, ignore_paths)
    outcomes = enumerate_outcomes(lambda rng: sampled_tree_step(rng, target, draft, PROMPT + GENERATED, 1,
                                                                widths=(2, 1), target_rows=rows))
    with pytest.raises(AssertionError):
        assert_matches_target(target, PROMPT + GENERATED, outcomes, 3)
