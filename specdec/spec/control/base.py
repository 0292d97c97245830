"""What every draft-size controller shares: the interface the engine calls, the screening of
one timing, the probe budget, and the memory tables' (de)serialisation."""
from __future__ import annotations

from dataclasses import dataclass
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


def keyed(table: dict) -> dict[str, float]:
    """A {K: value} table with JSON's string keys (_floats reads it back)."""
    return {str(int(k)): v for k, v in table.items()}


def floats(table: dict, keys: set[int] | None = None) -> dict[int, float]:
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
