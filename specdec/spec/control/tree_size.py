"""Tree size: for tree drafters, each step's node budget (0 = a plain step) among a few sizes,
by measured tokens per second."""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.spec.control.base import ProbeBudget, floats, keyed, screen_timing, step_seconds
from specdec.stats import StepRecord


@dataclass
class TreeSizeController:
    """For tree drafters: pick among a few tree sizes (0 = plain step) by measured tokens per
    second. Every size is tried a few steps, smallest first (acceptance is noisy; on a CPU a
    larger tree can win where a small one loses, since verifying more nodes costs little),
    unless a smaller tree already lost to plain steps; then the best is used and a neighbour
    of it re-measured now and then, less often while the best holds.
    Plain steps are re-measured regularly too: a first measurement taken while caches are cold
    must not keep them out for good."""

    sizes: list[int]
    fixed_size: int | None = None
    # steps per size before judging it: with 2, a tree that ran 1.3x plain on SmolLM2 at T=0 lost
    # its first judgment to a cold, unlucky pair of steps and stayed out for ~50 steps
    min_samples: int = 4
    probe_every: int = 16  # steps between probes of a neighbour of the best; the gap
    max_probe_every: int = 128  # doubles while the best stays the same
    plain_every: int = 32  # while trees win, a plain step this often (a cheap re-measure)
    decay: float = 0.9  # forgetting per observation of a size: acceptance drifts with the text
    recall_weight: float = 2.0  # steps a size's rate recalled from an earlier process counts as
    tokens: dict[int, float] = field(default_factory=dict)  # decayed sums by size
    seconds: dict[int, float] = field(default_factory=dict)
    weight: dict[int, float] = field(default_factory=dict)  # decayed step counts
    samples: dict[int, int] = field(default_factory=dict)  # steps measured by size
    best: int | None = None
    probe_gap: int = 0
    since_probe: int = 0
    probes: int = 0
    since_plain: int = 0
    budget: ProbeBudget = field(default_factory=ProbeBudget)
    probing: bool = False  # the size chosen last is a probe of a neighbour of the best

    def start_sequence(self) -> None:
        """A new text: acceptance may differ, so a neighbour of the best is probed soon."""
        self.probe_gap = self.probe_every
        self.since_probe = 0

    def rate(self, size: int) -> float:
        return self.tokens[size] / self.seconds[size] if self.seconds.get(size) else 0.0

    def choose(self, limit: int) -> int:
        self.probing = False  # a probe only if chosen as one below
        if self.fixed_size is not None:
            return self.fixed_size if self.fixed_size <= limit else 0
        allowed = sorted(s for s in set(self.sizes) | {0} if s <= limit)
        for size in allowed:  # explored smallest first (plain first of all)
            if self.samples.get(size, 0) < self.min_samples:
                if size > 0 and self._smaller_tree_loses(size, allowed):
                    break  # low acceptance: larger trees would only cost more to try
                return size
        best = max(allowed, key=self.rate)
        if best != self.best:
            self.best, self.probe_gap, self.since_probe = best, self.probe_every, 0
        self.since_plain += 1
        if best != 0 and self.since_plain > self.plain_every:
            return 0  # the baseline every tree must beat: keep its cost current
        self.since_probe += 1
        if self.since_probe >= self.probe_gap and self.budget.allows():
            self.since_probe = 0
            self.probe_gap = min(2 * self.probe_gap, self.max_probe_every)
            i = allowed.index(best)
            neighbours = allowed[max(0, i - 1):i] + allowed[i + 1:i + 2]
            if neighbours:
                self.probes += 1
                self.probing = True
                return neighbours[self.probes % len(neighbours)]
        return best

    def _smaller_tree_loses(self, size: int, allowed: list[int]) -> bool:
        """Whether a smaller tree, fully sampled, ran slower than plain steps: then drafts are
        rarely accepted here, and trying every larger size (each costs more per step) is what
        made a one-shot call at T=1 slower than plain decoding."""
        return any(0 < s < size and self.samples.get(s, 0) >= self.min_samples and self.rate(s) < self.rate(0)
                   for s in allowed)

    def memory(self) -> dict:
        """What a later process should start from (control/memory.py): the decayed tokens,
        seconds and step counts by tree size."""
        return {name: keyed(getattr(self, name)) for name in ("tokens", "seconds", "weight", "samples")}

    def recall(self, memory: dict) -> None:
        """Start from an earlier process's measurements (sizes this controller does not offer
        are dropped). Raises ValueError/TypeError/KeyError on a damaged entry, before changing
        anything."""
        sizes = set(self.sizes) | {0}
        tables = [floats(memory[name], sizes) for name in ("tokens", "seconds", "weight", "samples")]
        if len({frozenset(t) for t in tables}) != 1:
            raise ValueError("recalled tree tables cover different sizes")
        tokens, seconds, weight = tables[:3]
        # each size's recalled rate counts as at most recall_weight steps: a prior that this
        # process's own steps (its text, its load) outweigh within a few observations
        shrink = {size: min(1.0, self.recall_weight / w) if w > 0 else 1.0 for size, w in weight.items()}
        self.tokens = {size: v * shrink[size] for size, v in tokens.items()}
        self.seconds = {size: v * shrink[size] for size, v in seconds.items()}
        self.weight = {size: v * shrink[size] for size, v in weight.items()}
        self.samples = {k: int(v) for k, v in tables[3].items()}

    def observe(self, step: StepRecord) -> None:
        chosen = step.budget
        if chosen == 0:
            self.since_plain = 0
        best_rate = self.rate(self.best) if self.best is not None else 0.0
        self.budget.observe(step_seconds(step), step.accepted + 1, 1 / best_rate if best_rate > 0 else None,
                            self.probing)
        seconds = step.target_seconds + step.draft_seconds + step.other_seconds
        if chosen in self.weight:
            seconds, drop_old = screen_timing(seconds, self.seconds[chosen] / self.weight[chosen])
            if drop_old:
                for table in (self.tokens, self.seconds, self.weight):
                    table[chosen] = 0.0
        self.samples[chosen] = self.samples.get(chosen, 0) + 1
        for table, value in ((self.tokens, step.accepted + 1.0), (self.seconds, seconds), (self.weight, 1.0)):
            table[chosen] = self.decay * table.get(chosen, 0.0) + value
