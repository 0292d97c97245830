"""Adaptive draft length: each step pick the K (0 = a plain step) that maximises expected
tokens per second, from measured costs and a running estimate of the per-token acceptance.

Expected tokens from a step with K drafts, if each draft survives with probability a given
its predecessors did: 1 + a + ... + a^K = (1 - a^(K+1)) / (1 - a). Cost of the step:
target forward over K+1 tokens + K draft tokens + per-step overhead, all measured online."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec.spec.control.base import ProbeBudget, floats, keyed, screen_timing, step_seconds
from specdec.stats import StepRecord

PROBE_READ_SHARE = 0.1  # of the plain steps' time since the last draft, a probe's read may take
# exponents g in "the target keeps drafts of confidence P with chance P ** g" (ConfidenceCalibration)
GAMMAS = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
PRIOR_GAMMA, PRIOR_WEIGHT = 0.5, 10.0  # a pull towards g = 0.5 worth a few dozen drafts


@dataclass
class ConfidenceCalibration:
    """How a drafter's confidence P (its probability of all its drafts up to one) reads as the
    chance the target keeps them all: P ** gamma, gamma the likeliest of GAMMAS over the recent
    drafts (forgetting at `decay` a draft), pulled towards PRIOR_GAMMA while the drafts are few
    (one prompt's ~100 drafts moved the fit between 0.4 and 0.7). Draft models are
    underconfident: the Qwen pair's 0.5B, greedy on code, 8 drafts a step, had 65% of its drafts
    at P 0.3-0.4 kept and 77% at 0.4-0.5 (fit: 0.5 over 635 drafts, 0.4-0.5 over those a floor of
    0.3-0.5 would have drafted); sampled at T=1, 0.3."""
    decay: float = 0.995
    log_likelihood: list[float] = field(default_factory=lambda: [0.0] * len(GAMMAS))

    def observe(self, confidences: tuple[float, ...], accepted: int) -> None:
        for i, confidence in enumerate(confidences):
            if not 0 <= confidence <= 1:  # NaN from a broken draft row: no evidence
                continue
            p = min(max(confidence, 1e-9), 1 - 1e-9)
            kept = accepted > i
            for j, gamma in enumerate(GAMMAS):
                self.log_likelihood[j] = self.decay * self.log_likelihood[j] + (
                    gamma * math.log(p) if kept else math.log1p(-p ** gamma))

    @property
    def gamma(self) -> float:
        def score(j: int) -> float:
            return self.log_likelihood[j] - PRIOR_WEIGHT * math.log(GAMMAS[j] / PRIOR_GAMMA) ** 2
        return GAMMAS[max(range(len(GAMMAS)), key=score)]

    def confidence_for(self, chance: float) -> float:
        """The confidence at which the target keeps the drafts with this chance."""
        return chance ** (1 / self.gamma)


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
    probe_steps: int = 3  # drafted steps a probe spans: those after its first read nothing (choose)
    probe_left: int = 0  # of the current probe's steps
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
    held_back: bool = False  # the step chosen last is plain only because of upfront_seconds
    # the drafter stops its chain where its confidence falls below confidence_floor(): a drafting
    # step then gets the whole cap, and the drafter's own probabilities size the chain
    stops_at_floor: bool = False
    calibration: ConfidenceCalibration = field(default_factory=ConfidenceCalibration)
    drafting_rate: float | None = None  # tokens a second of drafted steps, as measured (EMA)

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
        winning, the first step probes again. The plain steps counted since the last draft
        carry over: a drafter's read that no short request repays (an editor's completions of
        ~50 tokens under a ~2,000-token file) is still paid once the plain steps of the
        requests before make it a small share (probe_read_fits); the draft model then keeps its
        cache for the next request (DraftModelProposer.reset)."""
        evidence = self.accepted_count + self.rejected_count
        scale = max(0.5, min(1.0, self.kept_evidence / evidence)) if evidence else 1.0
        self.accepted_count *= scale
        self.rejected_count *= scale
        self.probe_gap = self.probe_every
        self.plain_streak = max(self.plain_streak, self.probe_every)

    def choose(self, limit: int, upfront_seconds: float = 0.0, horizon: int | None = None,
               first_token: bool = False) -> int:
        """K for the next step, at most `limit` (tokens left, cache room). upfront_seconds: what
        the drafter must read before its first draft (a draft model's lazily read prompt),
        worth paying only where drafting's saving over the `horizon` tokens left repays it: a
        short answer to a long prompt (an editor's completion) is then decoded plainly, never
        slower than plain decoding. first_token: the step gives the answer's first token, which
        then never waits for that read (a streaming client sees it at plain decoding's time).
        A probe spans `probe_steps` drafted steps where the drafter has nothing more to read: its
        first pays the read (the prompt, the plain steps' tokens), which the probe budget charges
        and which made one-step probes dear; the next cost only their drafts and triple what the
        probe learns. After unlucky first drafts (an estimate far below break-even) a probe of one
        step often left it below, and the budget then held the next back for ~50 times the first's
        cost: the Qwen pair's 4-request bench decoded its T=0 prompts plainly (stop 71;
        tests/test_draft_read_gate.py simulates it)."""
        limit, self.probing, self.held_back = max(0, limit), False, False  # set below where so
        if self.fixed_k is not None:
            return min(self.fixed_k, limit)
        upper = min(self.max_k, limit)
        if upper == 0:
            return 0
        if first_token and upfront_seconds > 0:
            self.held_back = True
            return 0
        if not self.target_seconds or self.draft_seconds_per_token is None:
            return min(upper, 4)  # first step: measure a speculative step
        def rate(k: int) -> float:
            return self.expected_tokens(k) / self.step_cost(k)

        def repaid(k: int) -> bool:  # the tokens left at K's rate save more than the read costs
            if not upfront_seconds or horizon is None:
                return True
            return horizon * (1 / rate(0) - 1 / rate(k)) > upfront_seconds

        best = max(range(1, upper + 1), key=rate)
        if rate(best) < self.min_gain * rate(0):
            best = 0
        elif not repaid(best):
            best, self.held_back = 0, True
        if best > 0:
            self.plain_streak, self.probe_gap, self.probe_left = 0, self.probe_every, 0
            return upper if self.stops_at_floor else best
        if self.probe_left > 0 and not upfront_seconds:
            self.probe_left -= 1  # the probe's read is paid: its next steps draft for the cost of their drafts
            self.probing = True
            return min(self.probe_k, upper)
        self.probe_left = 0
        self.plain_streak += 1
        if (self.plain_streak >= (self.probe_gap or self.probe_every) and self.budget.allows()
                and (repaid(min(self.probe_k, upper)) or self.probe_read_fits(upfront_seconds))):
            self.plain_streak = 0
            self.probe_gap = min(2 * (self.probe_gap or self.probe_every), self.max_probe_every)
            self.probing, self.probe_left = True, self.probe_steps - 1
            return min(self.probe_k, upper)
        return 0

    def confidence_floor(self) -> float | None:
        """Where a drafter that stops_at_floor ends its chain: below this product of its drafts'
        probabilities one more draft pass costs more than it is expected to save. The next draft
        adds a token with the chance the target keeps the drafts so far (the calibration's
        reading of that product) times the acceptance estimate, a token worth the seconds one
        costs at drafted steps' measured rate (the modelled best rate until one is timed: the
        model, fed by the acceptance of drafts cut where they turn unsure, overrates longer
        chains and would raise the floor that cut them); the pass costs a draft token and one
        more verified row (the cost line's slope). 0 (no stop) until the costs are measured;
        None where chains are not sized so (a fixed K: exactly K drafts)."""
        if not self.stops_at_floor or self.fixed_k is not None:
            return None
        if self.draft_seconds_per_token is None or not self.target_seconds:
            return 0.0
        rate = self.drafting_rate or max(self.expected_tokens(k) / self.step_cost(k) for k in range(self.max_k + 1))
        row = max(0.0, (self.target_time(self.max_k) - self.target_time(1)) / max(1, self.max_k - 1))
        chance = min(1.0, (self.draft_seconds_per_token + row) * rate / self.acceptance)
        return self.calibration.confidence_for(chance)

    def probe_read_fits(self, upfront_seconds: float) -> bool:
        """Whether a probe may pay the drafter's read (what plain steps decoded since it last
        drafted, or a prompt never read) though drafting at the estimated acceptance would not
        repay it: where the read is within PROBE_READ_SHARE of the plain steps' time since the
        last draft. Else a few unlucky first drafts could switch drafting off for the rest of
        the answer: every plain step adds to the unread tokens, so no probe ever repaid them
        (Qwen pair, AMD EPYC Zen 5: acceptance estimated 0.38 after 3 drafts, ~0.8 once drafting
        resumed; bench/results/README.md, "stop 64"). A never-read long prompt with a short
        answer still waits: its read is many plain steps' worth."""
        return upfront_seconds <= PROBE_READ_SHARE * self.plain_streak * self.step_cost(0)

    def memory(self) -> dict:
        """What a later process should start from (control/memory.py): acceptance evidence
        and measured costs (a new sequence resets the probe gap anyway)."""
        return {"accepted": self.accepted_count, "rejected": self.rejected_count,
                "target_seconds": keyed(self.target_seconds),
                "draft_seconds_per_token": self.draft_seconds_per_token,
                "overhead_seconds": keyed(self.overhead_seconds),
                "calibration": list(self.calibration.log_likelihood)}

    def recall(self, memory: dict) -> None:
        """Start from an earlier process's state. Costs timed in this process (calibration)
        are kept over recalled ones. Raises ValueError/TypeError/KeyError on a damaged entry,
        before changing anything."""
        accepted, rejected = float(memory["accepted"]), float(memory["rejected"])
        target_seconds = floats(memory["target_seconds"], set(range(self.max_k + 1)))
        overhead = floats(memory["overhead_seconds"], {0, 1})
        draft = memory["draft_seconds_per_token"]
        draft = None if draft is None else floats({0: draft})[0]
        if min(accepted, rejected) < 0:
            raise ValueError("negative count in a recalled controller state")
        calibration = memory.get("calibration")  # absent in the memories of earlier versions
        if calibration is not None:
            calibration = [float(v) for v in calibration]
            if len(calibration) != len(GAMMAS) or not all(-math.inf < v <= 0 for v in calibration):
                raise ValueError("damaged confidence calibration in a recalled controller state")
            self.calibration.log_likelihood = calibration
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
            seconds = step.target_seconds + step.draft_seconds + step.other_seconds  # a catch-up is a one-off
            if seconds > 0:
                rate = (step.accepted + 1) / seconds
                self.drafting_rate = rate if self.drafting_rate is None else (
                    self.time_decay * self.drafting_rate + (1 - self.time_decay) * rate)
            if len(step.confidences) == k:
                self.calibration.observe(step.confidences, step.accepted)
            self.accepted_count = self.decay * self.accepted_count + step.accepted
            self.rejected_count = self.decay * self.rejected_count + (1 if step.accepted < k else 0)
