"""One draft length for all the sequences of a batched step, chosen from measured costs.

Alone, verifying K drafts costs little more than a plain step (decoding reads the weights
either way); in a batch of n sequences the pass holds sum_i (min(K, limit_i) + 1) rows (packed:
models/batch.py), and once the pass is compute-bound every drafted row costs as much as a
plain one. So the batch, not each sequence, picks K: the one that maximises the batch's
expected tokens per second,

    sum_i E_i(min(K, limit_i)) / (target(sum_i (min(K, limit_i) + 1)) + K * draft(n)),

with E_i(k) = 1 + a_i + ... + a_i^k from sequence i's own acceptance estimate (its
DraftLengthController), limit_i what sequence i can draft (its tokens left; for prompt lookup,
the length of its match), target(rows) the measured seconds of a batched pass over that many
rows and draft(n) of one batched draft-model pass. As the batch grows, K shrinks, down to
plain steps; while plain steps win, a short draft is still probed now and then so that the
acceptance estimates stay current, unless no K could win were every draft accepted."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specdec.spec.control.base import screen_timing


@dataclass
class CostTable:
    """Seconds by size (rows of a pass, or sequences in a draft pass): an EMA per measured
    size, linear between measured sizes and extrapolated beyond the largest."""
    seconds: dict[int, float] = field(default_factory=dict)
    decay: float = 0.8

    def observe(self, size: int, seconds: float) -> None:
        old = self.seconds.get(size)
        if old is None:
            self.seconds[size] = seconds
            return
        new, drop_old = screen_timing(seconds, old)
        self.seconds[size] = new if drop_old else self.decay * old + (1 - self.decay) * new

    def estimate(self, size: int) -> float | None:
        """None until two sizes are measured (or this one)."""
        if size in self.seconds:
            return self.seconds[size]
        if len(self.seconds) < 2:
            return None
        points = sorted(self.seconds.items())
        below = [p for p in points if p[0] < size]
        above = [p for p in points if p[0] > size]
        if not below:
            return above[0][1]
        (x0, y0), (x1, y1) = (below[-1], above[0]) if above else (points[-2], points[-1])
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        return max(y0, y0 + slope * (size - x0)) if above else y1 + slope * (size - x1)


@dataclass
class BatchDraftLength:
    target: CostTable = field(default_factory=CostTable)  # batched target pass, by rows
    draft: CostTable = field(default_factory=CostTable)  # one batched draft-model pass, by sequences
    min_gain: float = 1.03  # drafting must beat a plain step by this much: estimates are noisy
    probe_every: int = 16  # plain steps between probes of a short draft
    probe_k: int = 2
    plain_streak: int = 0
    cold: set[int] = field(default_factory=set)  # pass sizes run once: not measured yet

    def cost(self, limits: list[int], k: int, drafting: int) -> float | None:
        """Estimated seconds of a step at K = k of sequences that can draft limits[i] each,
        `drafting` of them running the draft model (None: not measured enough yet)."""
        target = self.target.estimate(sum(min(k, lim) + 1 for lim in limits))
        if target is None:
            return None
        draft = self.draft.estimate(drafting) if k and drafting else 0.0
        return target + k * (draft or 0.0)

    def choose(self, limits: list[int], expected: list[Callable[[int], float]], max_k: int,
               drafting: int = 0) -> int:
        """K for the step. limits[i]: drafts sequence i can take (0: a plain sequence);
        expected[i](k): its expected tokens from k drafts; drafting: sequences that would run
        the draft model."""
        n, upper = len(limits), min(max(limits, default=0), max_k)
        if upper <= 0:
            return 0
        probe = min(self.probe_k, upper)
        if self.target.estimate(n) is None or self.cost(limits, probe, drafting) is None:
            return 0 if n not in self.target.seconds else probe  # measure two sizes first

        plain = n / self.cost(limits, 0, drafting)
        if all(sum(min(k, lim) + 1 for lim in limits) / self.cost(limits, k, drafting) < self.min_gain * plain
               for k in range(1, upper + 1)):
            # no K pays even with every draft accepted (a compute-bound pass: each drafted row costs
            # what a plain one does), so no acceptance estimate could change the answer: no probe
            return 0

        def rate(k: int) -> float:
            return sum(e(min(k, lim)) for e, lim in zip(expected, limits)) / self.cost(limits, k, drafting)

        best = max(range(1, upper + 1), key=rate)
        if rate(best) >= self.min_gain * rate(0):
            self.plain_streak = 0
            return best
        self.plain_streak += 1
        if self.plain_streak >= self.probe_every:
            self.plain_streak = 0
            return probe
        return 0

    def observe(self, rows: int, target_seconds: float, drafting: int = 0,
                draft_passes: int = 0, draft_seconds: float = 0.0) -> None:
        """A step's measured costs: its target pass over `rows` rows, and its draft-model passes.
        The first pass over a number of rows that calibration did not time is not a cost: it
        builds the matrix kernels for that shape (packed passes meet many)."""
        if rows in self.target.seconds or rows in self.cold:
            self.target.observe(rows, target_seconds)
        else:
            self.cold.add(rows)
        if drafting and draft_passes:
            self.draft.observe(drafting, draft_seconds / draft_passes)
