"""Exact proof by enumeration (float64) for the tree verifier, plus tree utilities."""
import random

import pytest
import torch

from specdec.verify import (tree_attention_mask, tree_depths, verify_tree_greedy, verify_tree_sampling)

from enumerate import enumerate_outcomes
from test_verify_exact import RandomLM

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


class LM(RandomLM):
    def __call__(self, prefix):
        if prefix not in self.rows:
            g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**31)
            p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
            if self.sparse:
                p[torch.randint(0, V, (1,), generator=g)] = 0.0
            self.rows[prefix] = p / p.sum()
        return self.rows[prefix]


def node_prefix(i, tokens, parents):
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return tuple(reversed(out))


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
    outcomes = enumerate_outcomes(lambda rng: (lambda v: tuple(tokens[i] for i in v.path) + (v.next_token,))(
        verify_tree_sampling(tokens, parents, probs, rng)))
    depth = max(tree_depths(parents)) + 1
    got = {}
    for emitted, prob in outcomes.items():
        # complete to `depth` tokens with plain target sampling
        stack = [(emitted, prob)]
        while stack:
            seq, pr = stack.pop()
            if len(seq) == depth:
                got[seq] = got.get(seq, 0.0) + pr
                continue
            for t, pt in enumerate(target(ctx + seq).tolist()):
                if pt > 0:
                    stack.append((seq + (t,), pr * pt))
    want = {}
    stack = [((), 1.0)]
    while stack:
        seq, pr = stack.pop()
        if len(seq) == depth:
            want[seq] = pr
            continue
        for t, pt in enumerate(target(ctx + seq).tolist()):
            if pt > 0:
                stack.append((seq + (t,), pr * pt))
    keys = set(got) | set(want)
    assert max(abs(got.get(k, 0) - want.get(k, 0)) for k in keys) < 1e-9
    first = {}
    for seq, pr in got.items():
        first[seq[0]] = first.get(seq[0], 0) + pr
    assert all(abs(first.get(t, 0) - float(target(ctx)[t])) < 1e-9 for t in range(V))


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
