"""What one decode step did (StepRecord) and the totals over a generation (GenerationStats).

The engine emits one StepRecord per target pass; the controller, the stats, the CLI's stats
line, the server's `speculative` object, its metrics and the bench all read these records or
the totals built from them, so there is one definition of "drafted", "accepted" and each
timing."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class StepRecord:
    budget: int  # K the controller asked for (tree nodes for tree drafters; 0 = a plain step)
    drafted: int  # tokens (tree nodes) actually drafted: fewer than budget when the drafter runs dry
    accepted: int  # drafted tokens kept
    new_tokens: tuple[int, ...]  # tokens this step adds to the output (after EOS / max-token cuts)
    text: str  # text those tokens complete (held back while a stop string may be starting)
    draft_seconds: float  # proposing, excluding sync_seconds
    sync_seconds: float  # feeding the drafter tokens it did not draft (after plain steps)
    target_seconds: float  # the target's verification pass
    other_seconds: float  # verification, rollback, text: the per-step overhead
    stopped: bool = False  # EOS or a stop string ended the generation at this step
    confidences: tuple[float, ...] = ()  # the drafter's, after each draft (Proposal.confidences)


@dataclass
class GenerationStats:
    method: str
    lossy: bool = False  # True only with typical acceptance at T > 0
    new_tokens: int = 0
    target_forwards: int = 0  # decoding passes (the prompt's prefill pass is not counted)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_length_histogram: list[int] = field(default_factory=list)  # steps by drafts kept
    draft_tokens_per_step: list[int] = field(default_factory=list)  # tokens drafted each step
    cached_prompt_tokens: int = 0  # prompt tokens whose cache entries an earlier generation left (not computed)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0  # drafting including drafter sync
    target_seconds: float = 0.0
    other_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.method != "none"

    @property
    def acceptance_rate(self) -> float | None:
        if not self.speculative:
            return None
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens produced per target forward (accepted drafts + the target's own token)."""
        if not self.speculative:
            return None
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def num_drafts(self) -> int:
        """Steps that drafted at least one token (vLLM's spec_decode_num_drafts)."""
        return sum(1 for k in self.draft_tokens_per_step if k > 0)

    def add(self, step: StepRecord) -> None:
        self.target_forwards += 1
        self.new_tokens += len(step.new_tokens)
        self.drafted_tokens += step.drafted
        self.accepted_tokens += step.accepted
        self.draft_tokens_per_step.append(step.drafted)
        _add_count(self.accepted_length_histogram, step.accepted, 1)
        self.draft_seconds += step.draft_seconds + step.sync_seconds
        self.target_seconds += step.target_seconds
        self.other_seconds += step.other_seconds

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("draft_tokens_per_step")
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 tokens_per_second=self.tokens_per_second)
        return d

    @staticmethod
    def merge(all_stats: list[GenerationStats]) -> GenerationStats:
        """Totals over several generations: counts and seconds add up, histograms add
        bin by bin, per-step lists are concatenated."""
        out = GenerationStats(all_stats[0].method, lossy=any(s.lossy for s in all_stats))
        totals = [f.name for f in fields(GenerationStats) if f.type in ("int", "float")]
        for s in all_stats:
            for name in totals:
                setattr(out, name, getattr(out, name) + getattr(s, name))
            for accepted, count in enumerate(s.accepted_length_histogram):
                _add_count(out.accepted_length_histogram, accepted, count)
            out.draft_tokens_per_step.extend(s.draft_tokens_per_step)
        return out


def _add_count(histogram: list[int], index: int, count: int) -> None:
    if len(histogram) <= index:
        histogram.extend([0] * (index + 1 - len(histogram)))
    histogram[index] += count

