"""Verification of drafted tokens, as pure functions of probabilities (no models).

Notation: `target_probs[i]` is the target's final distribution for the token after the
context plus the first i drafted tokens (one more row than there are drafts);
`draft_probs[i]` is the distribution `draft_tokens[i]` was sampled from, or None for a
deterministic proposer (a point mass, q(x) = 1).

Randomness goes through a small `RandomSource` (coin flips and categorical draws) so tests
can enumerate every outcome of the real code with its exact probability."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.sampling import greedy_tokens, sample


class RandomSource(Protocol):
    def coin(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


class TorchRandom:
    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def coin(self, prob: float) -> bool:
        return torch.rand((), generator=self.generator, dtype=torch.float64).item() < prob

    def categorical(self, probs: torch.Tensor) -> int:
        return sample(probs, self.generator)


@dataclass
class ChainVerdict:
    num_accepted: int  # drafted tokens kept
    next_token: int  # the target's own token after them (correction or bonus)


def verify_greedy(draft_tokens: list[int], target_probs: torch.Tensor) -> ChainVerdict:
    """Keep the longest prefix equal to the target's argmax, then the target's argmax."""
    return verify_choices(draft_tokens, greedy_tokens(target_probs).tolist())


def verify_choices(draft_tokens: list[int], target_choice: list[int]) -> ChainVerdict:
    """Keep the longest prefix equal to the target's own deterministic choices (its argmax, or
    its seeded race winners: seeded.py), then the target's choice: the output is the one the
    target alone would give, whatever was drafted."""
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
        n += 1
    return ChainVerdict(n, target_choice[n])


def residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)); falls back to p when rounding leaves no mass."""
    residual = (target_row - draft_row).clamp_min(0)
    total = residual.sum()
    return residual / total if total > 0 else target_row


def point_mass(token: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def verify_rejection(draft_tokens: list[int], draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor, rng: RandomSource) -> ChainVerdict:
    """Leviathan/Chen rejection sampling: the output has exactly the target's distribution."""
    for i, x in enumerate(draft_tokens):
        p = float(target_probs[i, x])
        q = float(draft_probs[i, x]) if draft_probs is not None else 1.0
        if p >= q or rng.coin(p / q):  # accept with probability min(1, p/q)
            continue
        draft_row = draft_probs[i] if draft_probs is not None else point_mass(x, target_probs[i])
        return ChainVerdict(i, rng.categorical(residual_distribution(target_probs[i], draft_row)))
    k = len(draft_tokens)
    return ChainVerdict(k, rng.categorical(target_probs[k]))


# ---------------------------------------------------------------- trees
# A draft tree is data: node i holds tokens[i] and parents[i] (-1 = the root, i.e. the last
# context token that is fed first). Parents come before children; siblings hold distinct
# tokens. target_probs row 0 is the distribution after the root, row 1+i after node i.


@dataclass
class TreeVerdict:
    path: list[int]  # accepted node indices, root to leaf
    next_token: int


def tree_children(parents: list[int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    return children


def tree_depths(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """Bool [N+1, N+1] over [root] + nodes: each attends to itself and its ancestors."""
    n = len(parents) + 1
    mask = torch.eye(n, dtype=torch.bool)
    mask[:, 0] = True
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i + 1] |= mask[p + 1]
    return mask


def verify_tree_greedy(tokens: list[int], parents: list[int], target_probs: torch.Tensor) -> TreeVerdict:
    """Follow the child equal to the target's argmax."""
    return verify_tree_choices(tokens, parents, greedy_tokens(target_probs).tolist())


def verify_tree_choices(tokens: list[int], parents: list[int], choice: list[int]) -> TreeVerdict:
    """Follow the child equal to the target's deterministic choice at each node (row 0: the
    root's, row 1+i: node i's), as verify_choices does along a chain."""
    children = tree_children(parents)
    path, node = [], -1
    while True:
        want = choice[node + 1]
        nxt = next((c for c in children.get(node, []) if tokens[c] == want), None)
        if nxt is None:
            return TreeVerdict(path, want)
        path.append(nxt)
        node = nxt


def verify_tree_sampling(tokens: list[int], parents: list[int], target_probs: torch.Tensor,
                         rng: RandomSource, draft_probs: torch.Tensor | None = None,
                         draws: list[list[int]] | None = None) -> TreeVerdict:
    """Lossless tree walk (recursive rejection sampling, as in SpecInfer and EAGLE). At a node,
    with r the target's distribution there, try candidate tokens in order:

    - deterministic candidates (draft_probs None): the node's children in index order; x is
      accepted with probability r(x), else r(x) = 0 and r is renormalised;
    - sampled candidates: row v+1 of draft_probs is the distribution q the children of node v
      (row 0: of the root) were drawn from without replacement, in the order draws[v+1]; that
      order may hold drawn tokens left out of the tree. x is accepted with probability
      min(1, r(x)/q(x)), else r = normalize(max(0, r - q)) and q loses x (renormalised).

    An accepted child is walked into; an accepted token outside the tree ends the step as the
    target's token. When every candidate is rejected, the target's token is sampled from r."""
    children = tree_children(parents)
    path, node = [], -1
    while True:
        kids = {tokens[c]: c for c in children.get(node, [])}
        if draft_probs is None:
            token, r = _try_candidates(target_probs[node + 1], list(kids), None, rng)
        else:
            token, r = _try_candidates(target_probs[node + 1], draws[node + 1], draft_probs[node + 1], rng)
        if token is None:
            return TreeVerdict(path, rng.categorical(r))
        if token not in kids:
            return TreeVerdict(path, token)
        path.append(kids[token])
        node = kids[token]


def _try_candidates(target_row: torch.Tensor, candidates: list[int], draft_row: torch.Tensor | None,
                    rng: RandomSource) -> tuple[int | None, torch.Tensor]:
    """(accepted token or None, the distribution left to sample from)."""
    r = target_row
    q = draft_row
    for x in candidates:
        px = float(r[x])
        qx = float(q[x]) if q is not None else 1.0
        if qx <= 0.0:  # could not have been drawn (rounding guard)
            continue
        if px >= qx or (px > 0.0 and rng.coin(px / qx)):
            return x, r
        if q is None:
            r = r.clone()
            r[x] = 0.0
        else:
            r = (r - q).clamp_min(0.0)
            q = q.clone()
            q[x] = 0.0
            q = q / q.sum() if q.sum() > 0 else q
        total = r.sum()
        if total <= 0:  # rounding: all mass was on rejected candidates
            return None, target_row
        r = r / total
    return None, r


def verify_tree_typical(tokens: list[int], parents: list[int], target_probs: torch.Tensor,
                        rng: RandomSource, epsilon: float = 0.09, delta: float = 0.3) -> TreeVerdict:
    """LOSSY "typical acceptance" (Medusa paper): accept a candidate whose target probability
    exceeds min(epsilon, delta * exp(-entropy)); the output no longer follows the target's
    distribution exactly. Off by default; offered for comparison with the Medusa code."""
    children = tree_children(parents)
    path, node = [], -1
    while True:
        p = target_probs[node + 1]
        entropy = float(-(p * torch.log(p.clamp_min(1e-30))).sum())
        threshold = min(epsilon, delta * float(torch.exp(torch.tensor(-entropy))))
        nxt = next((c for c in children.get(node, []) if float(p[tokens[c]]) > threshold), None)
        if nxt is None:
            return TreeVerdict(path, rng.categorical(p))
        path.append(nxt)
        node = nxt
