"""Exact outcome distributions of randomized code, by replaying every branch of its
RandomSource (coin flips and categorical draws) with its probability."""
from __future__ import annotations

from collections import defaultdict

import torch


class ScriptedRandom:
    """Follows a script of branch choices, then always takes the first possible branch,
    recording every branch point so the caller can explore the others."""

    def __init__(self, script: list[int]):
        self.script = script
        self.taken: list[int] = []
        self.options: list[list[tuple[int, float]]] = []  # per branch point: (choice, prob)
        self.prob = 1.0

    def _branch(self, options: list[tuple[int, float]]) -> int:
        options = [(c, p) for c, p in options if p > 0]
        i = len(self.taken)
        choice = self.script[i] if i < len(self.script) else options[0][0]
        prob = dict(options)[choice]
        self.taken.append(choice)
        self.options.append(options)
        self.prob *= prob
        return choice

    def coin(self, prob: float) -> bool:
        return bool(self._branch([(1, float(prob)), (0, 1.0 - float(prob))]))

    def categorical(self, probs: torch.Tensor) -> int:
        return self._branch([(i, float(p)) for i, p in enumerate(probs.tolist())])


def enumerate_outcomes(run) -> dict:
    """run(rng) -> hashable outcome; returns {outcome: exact probability}."""
    out: dict = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        rng = ScriptedRandom(script)
        result = run(rng)
        out[result] += rng.prob
        for j in range(len(script), len(rng.taken)):
            for choice, _ in rng.options[j][1:]:
                stack.append(rng.taken[:j] + [choice])
    return dict(out)


class RandomLM:
    """Next-token distributions indexed by prefix, random but fixed (p ~ U^power, normalised);
    sparse: one token per row gets exactly zero, as top-k/top-p filters do."""

    def __init__(self, seed: int, sparse: bool = False, vocab_size: int = 3, power: int = 2):
        self.seed, self.sparse, self.vocab_size, self.power, self.rows = seed, sparse, vocab_size, power, {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**31)
            p = torch.rand(self.vocab_size, generator=g, dtype=torch.float64) ** self.power
            if self.sparse:
                p[torch.randint(0, self.vocab_size, (1,), generator=g)] = 0.0
            self.rows[prefix] = p / p.sum()
        return self.rows[prefix]
