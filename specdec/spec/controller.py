"""Adaptive draft length: each step pick the K (0 = a plain step) that maximises expected
tokens per second, from measured costs and a running estimate of the per-token acceptance.

Expected tokens from a step with K drafts, if each draft survives with probability a given
its predecessors did: 1 + a + ... + a^K = (1 - a^(K+1)) / (1 - a). Cost of the step:
target forward over K+1 tokens + K draft tokens + per-step overhead, all measured online."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from specdec.stats import StepRecord


class Controller(Protocol):
    """Chooses each step's draft budget (K tokens for chains, nodes for trees; 0 = plain step)
    and learns from what the step measured."""

    def start_sequence(self) -> None: ...

    def choose(self, limit: int) -> int: ...

    def observe(self, step: StepRecord) -> None: ...

    def memory(self) -> dict: ...

    def recall(self, memory: dict) -> None: ...


def _keyed(table: dict) -> dict[str, float]:
    """A {K: value} table with JSON's string keys (_floats reads it back)."""
    return {str(int(k)): v for k, v in table.items()}


def _floats(table: dict, keys: set[int] | None = None) -> dict[int, float]:
    """A recalled {"K": value} table as {K: value} (only the given keys); raises on a value that
    is not a finite non-negative number, so that a damaged entry is ignored whole."""
    out = {int(k): float(v) for k, v in table.items()}
    if any(not 0 <= v < float("inf") for v in out.values()):
        raise ValueError("negative or infinite value in a recalled table")
    return {k: v for k, v in out.items() if keys is None or k in keys}


@dataclass
class ProbeBudget:
    """What probing may cost. A probe (drafting where plain steps, or another tree size, are
    measured to win) is how a controller notices acceptance rising; but where drafts are rarely
    accepted (T=1) every probe is a loss, and a new sequence used to restart probing, so short
    requests paid it again and again. The time probes lost against the choice they replaced
    (their tokens at that choice's rate; drafter catch-up included) is kept within `share` of
    all step time: a probe waits until the steps since have paid for the last one."""
    share: float = 0.02
    lost: float = 0.0
    spent: float = 0.0

    def allows(self) -> bool:
        return self.lost <= self.share * self.spent

    def observe(self, seconds: float, tokens: float, replaced_seconds_per_token: float | None,
                probe: bool) -> None:
        self.spent += seconds
        if probe and replaced_seconds_per_token is not None:
            self.lost += max(0.0, seconds - tokens * replaced_seconds_per_token)


def step_seconds(step: StepRecord) -> float:
    """All a step cost, the drafter's catch-up included."""
    return step.target_seconds + step.draft_seconds + step.sync_seconds + step.other_seconds


def screen_timing(new: float, estimate: float) -> tuple[float, bool]:
    """Timings are only ever inflated (cold kernels for a new shape, stalls). Returns the
    sample to use, capped at twice the estimate so one stall cannot swing the cost model, and
    whether the estimate itself must be dropped: a sample under half of it shows that the
    estimate was built on such inflated steps."""
    if new < estimate / 2:
        return new, True
    return min(new, 2 * estimate), False


@dataclass
class DraftLengthController:
    max_k: int = 8
    fixed_k: int | None = None  # a fixed K disables adaptation
    prior_acceptance: float = 0.6
    prior_weight: float = 1.0
    min_gain: float = 1.03  # drafting must beat a plain step by this much: estimates are noisy
    decay: float = 0.9  # forgetting per observation: acceptance drifts with the text
    probe_every: int = 20  # when plain steps win, still draft now and then to track acceptance;
    max_probe_every: int = 160  # the gap doubles while plain keeps winning
    probe_k: int = 2
    time_decay: float = 0.8
    accepted_count: float = 0.0
    rejected_count: float = 0.0
    target_seconds: dict[int, float] = field(default_factory=dict)  # EMA by K
    stale_after: int = 32  # a K >= 1 not drafted in this many speculative steps is forgotten
    speculative_steps: int = 0
    last_drafted: dict[int, int] = field(default_factory=dict)  # K -> speculative step it last ran
    draft_seconds_per_token: float | None = None
    overhead_seconds: dict[bool, float] = field(default_factory=dict)  # keyed by K > 0
    plain_streak: int = 0
    probe_gap: int = 0  # current gap between probes (0: not yet set)
    kept_evidence: float = 4.0
    budget: ProbeBudget = field(default_factory=ProbeBudget)
    probing: bool = False  # the step chosen last is a probe

    @property
    def acceptance(self) -> float:
        a = ((self.accepted_count + self.prior_weight * self.prior_acceptance)
             / (self.accepted_count + self.rejected_count + self.prior_weight))
        return min(a, 0.999)

    def expected_tokens(self, k: int) -> float:
        a = self.acceptance
        return (1 - a ** (k + 1)) / (1 - a)

    def target_time(self, k: int) -> float:
        """Measured EMA for K, else a line through the measured K >= 1 points. A 1-token pass
        (K = 0) is kept out of the fit: on CPUs it often takes a faster matrix-vector path."""
        if k in self.target_seconds:
            return self.target_seconds[k]
        pts = sorted((kk, t) for kk, t in self.target_seconds.items() if kk >= 1)
        if k == 0:
            return pts[0][1] if pts else 0.0
        if not pts:
            return self.target_seconds.get(0, 0.0) * 1.3
        if len(pts) == 1:
            k1, t1 = pts[0]
            return t1 * (1 + 0.05 * (k - k1))
        n = len(pts)
        mk = sum(p[0] for p in pts) / n
        mt = sum(p[1] for p in pts) / n
        var = sum((p[0] - mk) ** 2 for p in pts)
        slope = max(0.0, sum((p[0] - mk) * (p[1] - mt) for p in pts) / var)
        return max(mt + slope * (k - mk), min(p[1] for p in pts))

    def step_cost(self, k: int) -> float:
        cost = self.target_time(k) + self.overhead_seconds.get(k > 0, 0.0)
        if k > 0:
            cost += k * (self.draft_seconds_per_token or 0.0)
        return cost

    def start_sequence(self) -> None:
        """A new text: costs carry over, but its acceptance may differ, so the old evidence
        is halved (but kept at `kept_evidence` steps' worth at least: else the prior, not the
        drafts' failures, decides the next text's first steps) and, if plain steps were
        winning, the first step probes again."""
        evidence = self.accepted_count + self.rejected_count
        scale = max(0.5, min(1.0, self.kept_evidence / evidence)) if evidence else 1.0
        self.accepted_count *= scale
        self.rejected_count *= scale
        self.probe_gap = self.probe_every
        self.plain_streak = self.probe_every

    def choose(self, limit: int) -> int:
        """K for the next step, at most `limit` (tokens left, cache room)."""
        limit = max(0, limit)
        if self.fixed_k is not None:
            return min(self.fixed_k, limit)
        upper = min(self.max_k, limit)
        if upper == 0:
            return 0
        self.probing = False
        if not self.target_seconds or self.draft_seconds_per_token is None:
            return min(upper, 4)  # first step: measure a speculative step
        def rate(k: int) -> float:
            return self.expected_tokens(k) / self.step_cost(k)

        best = max(range(1, upper + 1), key=rate)
        if rate(best) < self.min_gain * rate(0):
            best = 0
        if best > 0:
            self.plain_streak, self.probe_gap = 0, self.probe_every
            return best
        self.plain_streak += 1
        if self.plain_streak >= (self.probe_gap or self.probe_every) and self.budget.allows():
            self.plain_streak = 0
            self.probe_gap = min(2 * (self.probe_gap or self.probe_every), self.max_probe_every)
            self.probing = True
            return min(self.probe_k, upper)
        return 0

    def memory(self) -> dict:
        """What a later process should start from (controller_memory.py): acceptance evidence
        and measured costs (a new sequence resets the probe gap anyway)."""
        return {"accepted": self.accepted_count, "rejected": self.rejected_count,
                "target_seconds": _keyed(self.target_seconds),
                "draft_seconds_per_token": self.draft_seconds_per_token,
                "overhead_seconds": _keyed(self.overhead_seconds)}

    def recall(self, memory: dict) -> None:
        """Start from an earlier process's state. Costs timed in this process (calibration)
        are kept over recalled ones. Raises ValueError/TypeError/KeyError on a damaged entry,
        before changing anything."""
        accepted, rejected = float(memory["accepted"]), float(memory["rejected"])
        target_seconds = _floats(memory["target_seconds"], set(range(self.max_k + 1)))
        overhead = _floats(memory["overhead_seconds"], {0, 1})
        draft = memory["draft_seconds_per_token"]
        draft = None if draft is None else _floats({0: draft})[0]
        if min(accepted, rejected) < 0:
            raise ValueError("negative count in a recalled controller state")
        self.accepted_count, self.rejected_count = accepted, rejected
        self.target_seconds = target_seconds | self.target_seconds
        self.overhead_seconds = {bool(k): v for k, v in overhead.items()} | self.overhead_seconds
        if self.draft_seconds_per_token is None:
            self.draft_seconds_per_token = draft

    def observe(self, step: StepRecord) -> None:
        k, target_seconds, overhead_seconds = step.drafted, step.target_seconds, step.other_seconds
        plain = self.step_cost(0) if 0 in self.target_seconds else None
        self.budget.observe(step_seconds(step), step.accepted + 1, plain, self.probing)

        def ema(old: float | None, new: float) -> float:
            if old is None:
                return new
            new, drop_old = screen_timing(new, old)
            return new if drop_old else self.time_decay * old + (1 - self.time_decay) * new

        self.target_seconds[k] = ema(self.target_seconds.get(k), target_seconds)
        self.overhead_seconds[k > 0] = ema(self.overhead_seconds.get(k > 0), overhead_seconds)
        if k > 0:
            # forget other K's timings once stale (e.g. one cold first pass), so the cost line
            # is fitted to what runs now
            self.speculative_steps += 1
            self.last_drafted[k] = self.speculative_steps
            for old_k, at in list(self.last_drafted.items()):
                if self.speculative_steps - at > self.stale_after:
                    del self.last_drafted[old_k], self.target_seconds[old_k]
            self.draft_seconds_per_token = ema(self.draft_seconds_per_token, step.draft_seconds / k)
            self.accepted_count = self.decay * self.accepted_count + step.accepted
            self.rejected_count = self.decay * self.rejected_count + (1 if step.accepted < k else 0)


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
        if self.fixed_size is not None:
            return self.fixed_size if self.fixed_size <= limit else 0
        self.probing = False
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
        """What a later process should start from (controller_memory.py): the decayed tokens,
        seconds and step counts by tree size."""
        return {name: _keyed(getattr(self, name)) for name in ("tokens", "seconds", "weight", "samples")}

    def recall(self, memory: dict) -> None:
        """Start from an earlier process's measurements (sizes this controller does not offer
        are dropped). Raises ValueError/TypeError/KeyError on a damaged entry, before changing
        anything."""
        sizes = set(self.sizes) | {0}
        tables = [_floats(memory[name], sizes) for name in ("tokens", "seconds", "weight", "samples")]
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
