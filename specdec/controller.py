"""Adaptive draft length: each step pick the K (0 = a plain step) that maximises expected
tokens per second, from measured costs and a running estimate of the per-token acceptance.

Expected tokens from a step with K drafts, if each draft survives with probability a given
its predecessors did: 1 + a + ... + a^K = (1 - a^(K+1)) / (1 - a). Cost of the step:
target forward over K+1 tokens + K draft tokens + per-step overhead, all measured online."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftLengthController:
    max_k: int = 8
    fixed_k: int | None = None  # a fixed K disables adaptation
    prior_acceptance: float = 0.6
    prior_weight: float = 2.0
    decay: float = 0.9  # forgetting per observation: acceptance drifts with the text
    probe_every: int = 20  # when plain steps win, still draft this often to track acceptance
    probe_k: int = 2
    time_decay: float = 0.8
    accepted_count: float = 0.0
    rejected_count: float = 0.0
    target_seconds: dict[int, float] = field(default_factory=dict)  # EMA by K
    draft_seconds_per_token: float | None = None
    overhead_seconds: dict[bool, float] = field(default_factory=dict)  # keyed by K > 0
    plain_streak: int = 0

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

    def choose(self, limit: int) -> int:
        """K for the next step, at most `limit` (tokens left, cache room)."""
        limit = max(0, limit)
        if self.fixed_k is not None:
            return min(self.fixed_k, limit)
        upper = min(self.max_k, limit)
        if upper == 0:
            return 0
        if not self.target_seconds or self.draft_seconds_per_token is None:
            return min(upper, 4)  # first step: measure a speculative step
        best = max(range(upper + 1), key=lambda k: self.expected_tokens(k) / self.step_cost(k))
        if best == 0:
            self.plain_streak += 1
            if self.plain_streak % self.probe_every == 0:
                return min(self.probe_k, upper)
        else:
            self.plain_streak = 0
        return best

    def observe(self, chosen: int, k: int, num_accepted: int, target_seconds: float,
                draft_seconds: float, overhead_seconds: float) -> None:
        """chosen: the K asked for; k: tokens actually drafted."""
        def ema(old: float | None, new: float) -> float:
            return new if old is None else self.time_decay * old + (1 - self.time_decay) * new

        self.target_seconds[k] = ema(self.target_seconds.get(k), target_seconds)
        self.overhead_seconds[k > 0] = ema(self.overhead_seconds.get(k > 0), overhead_seconds)
        if k > 0:
            self.draft_seconds_per_token = ema(self.draft_seconds_per_token, draft_seconds / k)
            self.accepted_count = self.decay * self.accepted_count + num_accepted
            self.rejected_count = self.decay * self.rejected_count + (1 if num_accepted < k else 0)


@dataclass
class TreeSizeController:
    """For tree drafters: pick among a few tree sizes (0 = plain step) by measured tokens per
    second, trying each once and re-probing the others now and then."""

    sizes: list[int]
    fixed_size: int | None = None
    probe_every: int = 24
    decay: float = 0.8
    tokens_per_step: dict[int, float] = field(default_factory=dict)
    seconds_per_step: dict[int, float] = field(default_factory=dict)
    steps: int = 0

    def choose(self, limit: int) -> int:
        if self.fixed_size is not None:
            return self.fixed_size if self.fixed_size <= limit else 0
        allowed = [s for s in sorted(set(self.sizes) | {0}, reverse=True) if s <= limit]
        self.steps += 1
        untried = [s for s in allowed if s not in self.tokens_per_step]
        if untried:
            return untried[0]
        rate = {s: self.tokens_per_step[s] / self.seconds_per_step[s] for s in allowed}
        best = max(allowed, key=rate.__getitem__)
        if self.steps % self.probe_every == 0:  # re-measure a neighbouring size
            ordered = sorted(allowed)
            i = ordered.index(best)
            neighbours = ordered[max(0, i - 1):i] + ordered[i + 1:i + 2]
            if neighbours:
                return neighbours[(self.steps // self.probe_every) % len(neighbours)]
        return best

    def observe(self, chosen: int, k: int, num_accepted: int, target_seconds: float,
                draft_seconds: float, overhead_seconds: float) -> None:
        k = chosen
        seconds = target_seconds + draft_seconds + overhead_seconds
        for table, value in ((self.tokens_per_step, num_accepted + 1.0), (self.seconds_per_step, seconds)):
            old = table.get(k)
            table[k] = value if old is None else self.decay * old + (1 - self.decay) * value
