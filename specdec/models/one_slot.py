"""Any single-sequence Runner (native, compiled, transformers) as a batch of one slot, so the
one decode loop (engine/scheduler.py) serves a lone request exactly as the runner computes it: the
same passes, kernels and cache a single-sequence decoder would use (BatchRunner's interface
for slot 0)."""
from __future__ import annotations

import torch

from specdec.models.cache import PassPlan
from specdec.models.runner import Runner


class OneSlotRunner:
    def __init__(self, runner: Runner):
        self.runner = runner
        self.max_len = runner.max_len
        self.last_hidden: list[torch.Tensor] = []

    @property
    def kv_rows_invariant(self) -> bool:
        """Whether the cache's rows are what a fresh prefill writes (prefix reuse may keep them)."""
        return getattr(self.runner, "kv_rows_invariant", False)

    def length(self, slot: int = 0) -> int:
        return self.runner.length

    def forward(self, plan: PassPlan) -> list[torch.Tensor]:
        """The one slot's pass: plan.rows[0] appended; a tree puts each row at its depth's position."""
        (row,) = plan.rows
        tree = plan.trees[0] if plan.trees else None
        kwargs = {}
        if tree is not None:
            kwargs = {"attn_mask": tree, "positions": self.runner.length + tree.sum(1) - 1}
        exact = bool(plan.exact and plan.exact[0])
        logits = self.runner.extend(row, want_hidden=plan.want_hidden, exact=exact, **kwargs)
        self.last_hidden = [self.runner.last_hidden] if plan.want_hidden else []
        return [logits]

    def extend_slot(self, slot: int, ids: list[int], exact: bool = False, want_logits: bool = True,
                    want_hidden: bool = False) -> torch.Tensor | None:
        """A prefill chunk."""
        logits = self.runner.extend(ids, want_hidden=want_hidden, exact=exact, want_logits=want_logits)
        self.last_hidden = [self.runner.last_hidden] if want_hidden else []
        return logits

    def rollback(self, slot: int, length: int) -> None:
        self.runner.rollback(length)

    def keep(self, slot: int, start: int, offsets: list[int]) -> None:
        self.runner.keep(start, offsets)

    def move(self, src: int, dst: int) -> None:
        raise AssertionError("a batch of one never moves a slot")
