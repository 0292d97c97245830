"""Whether a batch's forked drafters (a tree method's head, a draft with another tokenizer:
one proposer per sequence, engine/batch_drafting.py) draft at all in a step.

Their passes run one sequence after another, a cost no sequence's own controller sees (each is
charged the shared target pass whatever it drafts). So the batch measures its own tokens a
second with them and without, by batch size (a power of two; a two-size TreeSizeController: 0
off, 1 on), after a bound from measured costs has said that drafting could pay at all."""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.spec.control.base import Controller, screen_timing
from specdec.spec.control.batch_width import BatchDraftLength
from specdec.spec.control.tree_size import TreeSizeController
from specdec.stats import StepRecord


def expected_tokens(controller: Controller, size: int) -> float:
    """A sequence's expected tokens from a step of `size` drafts (a tree: nodes): a chain's
    acceptance estimate, or a tree controller's measured tokens a step at that size (every
    node accepted where it has not measured it)."""
    if hasattr(controller, "expected_tokens"):
        return controller.expected_tokens(size)
    weight = getattr(controller, "weight", {}).get(size, 0.0)
    return controller.tokens[size] / weight if weight > 0 else size + 1.0


@dataclass
class ForkedGate:
    width: BatchDraftLength  # the batch's measured pass costs
    buckets: dict[int, TreeSizeController] = field(default_factory=dict)  # by batch size (a power of two)
    current: tuple[TreeSizeController, int] | None = None  # this step's bucket and choice
    # a fork's drafting seconds per drafted token (a tree: node), its catch-up left out, measured
    # wherever a fork drafts (a sequence alone too); None until then: drafting counted free
    draft_seconds_per_token: float | None = None
    decay: float = 0.8
    # steps where every fork drafts one node and they are read together (spec/proposers/
    # batch_eagle.py: one head pass for all): their own buckets and drafting seconds a node
    together_buckets: dict[int, TreeSizeController] = field(default_factory=dict)
    together_seconds_per_token: float | None = None

    def allows(self, n: int, forked: list[tuple[Controller, int]], together: bool = False) -> bool:
        """Whether the forked drafters of a step of n sequences may draft; forked: the
        controller and draft limit of each forked sequence that could; together: each would
        draft one node, all read together."""
        self.current = None
        if not self.could_pay(n, forked, together):
            return False
        bucket = 1 << (n.bit_length() - 1)
        buckets = self.together_buckets if together else self.buckets
        gate = buckets.setdefault(bucket, TreeSizeController([1]))
        # read together, drafting costs less a sequence the fuller the batch: a smaller batch's
        # loss says nothing of a larger one's
        if gate.samples.get(1, 0) < gate.min_samples and not together and self._smaller_batch_off(bucket):
            self.current = (gate, 0)  # not explored: a smaller batch measured it losing
            return False
        self.current = (gate, gate.choose(1))
        return self.current[1] == 1

    def could_pay(self, n: int, forked: list[tuple[Controller, int]], together: bool = False) -> bool:
        """Whether forked drafting could beat a plain step of n sequences at all, by the batch's
        measured pass costs and each sequence's measured tokens a step at each size its
        controller may choose (an unmeasured size counts every node accepted), drafting itself
        charged at the forks' measured seconds a drafted token (free until measured: the forks
        draft one after another, so a full batch pays each one's), by the margin the batch's K
        asks of drafts (estimates are noisy). Once a pass is compute-bound a drafted row costs
        about as much as a plain one and pays only if nearly always accepted (SmolLM2 bf16 here:
        2.45 ms a row in a 16-row pass, 2.34 in a 32-row one); where it cannot pay, the gate is
        neither explored nor charged. Read together (one node each, one head pass for all), a
        draft is charged at what such passes measured a node (SmolLM2 here: ~0.04 ms, against
        0.2-0.6 ms drafted alone)."""
        plain = self.width.target.estimate(n)
        if not plain or not forked:
            return True
        # the sizes each controller may choose within its limit (a tree's smallest size may not
        # fit: a batch of 16 leaves 3 rows a sequence, a tree controller's sizes start at 2)
        choices = [(controller, [size for size in getattr(controller, "sizes", range(1, lim + 1)) if 0 < size <= lim])
                   for controller, lim in forked]
        for size in sorted({size for _, sizes in choices for size in sizes}):
            rows, tokens = n, float(n)
            for controller, sizes in choices:
                if size in sizes:
                    rows += size
                    tokens += expected_tokens(controller, size) - 1
            cost = self.width.target.estimate(rows)
            if cost is None:
                return True
            per_token = self.together_seconds_per_token if together else self.draft_seconds_per_token
            cost += (rows - n) * (per_token or 0.0)
            if tokens / cost > self.width.min_gain * n / plain:
                return True
        return False

    def observe_drafting(self, seconds: float, tokens: int, together: bool = False) -> None:
        """One fork's drafting: `tokens` drafts (a tree: nodes) in `seconds`; together: the one-node
        drafts of several forks read together, `tokens` of them."""
        if tokens <= 0 or seconds <= 0:
            return
        name = "together_seconds_per_token" if together else "draft_seconds_per_token"
        rate, old = seconds / tokens, getattr(self, name)
        if old is not None:
            rate, drop_old = screen_timing(rate, old)  # one stall must not switch a batch's drafting off
            rate = rate if drop_old else self.decay * old + (1 - self.decay) * rate
        setattr(self, name, rate)

    def _smaller_batch_off(self, bucket: int) -> bool:
        """Whether a smaller batch measured forked drafting slower than plain steps. Its cost
        only grows with the batch (a pass fuller of rows is more compute-bound, and the forks
        draft one after another), and so does what an exploration step loses: a batch is not
        explored where a smaller one lost."""
        return any(size < bucket and gate.samples.get(0, 0) >= gate.min_samples
                   and gate.samples.get(1, 0) >= gate.min_samples and gate.rate(1) < gate.rate(0)
                   for size, gate in self.buckets.items())

    def observe_step(self, tokens: int, seconds: float, sequences: int, sync_seconds: float = 0.0) -> None:
        """The whole batch step's tokens and seconds (drafting, pass, verification), for the
        bucket consulted in allows(). A bucket holds batches of n to 2n - 1 sequences, and a
        fuller step gives more tokens a second with or without drafts: each step is judged per
        sequence against a plain pass over as many (the width's measured costs), so that
        drafting measured in fuller steps than the plain ones does not look like a gain.
        sync_seconds: the forks' read of features that plain steps left (in seconds): a one-off
        after plain steps, which the bucket's rates leave out as a sequence's controller does
        (else the first drafting steps after a plain stretch, which pay it, judge drafting)."""
        if self.current is not None and tokens > 0:
            gate, on = self.current
            plain = self.width.target.estimate(sequences)
            scale = plain if plain else 1.0
            if plain:  # tokens a sequence (a fraction) in units of that plain pass
                tokens = tokens / sequences
            gate.observe(StepRecord(budget=on, drafted=0, accepted=tokens - 1, new_tokens=(), text="",
                                    draft_seconds=0.0, sync_seconds=sync_seconds / scale,
                                    target_seconds=(seconds - sync_seconds) / scale, other_seconds=0.0))
        self.current = None
