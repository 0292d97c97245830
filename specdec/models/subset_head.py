"""A draft model's output head cut to the tokens it is likely to propose (frequency-ranked
drafting, as FR-Spec, Zhao et al. 2025): the head of a 0.5B Qwen is 152k rows, 28% of the
draft's weights (6 of its ~20-29 ms a 1-token pass). The other tokens get logit -inf, so the draft's
distribution is its softmax over the subset: that is the q the verifier reads, so greedy and
sampled outputs stay exactly the target's; only the acceptance of the tokens left out is lost."""
from __future__ import annotations

import torch
from torch import nn

from specdec.models.grouped import GroupedLinear
from specdec.models.grouped_weights import Grouped


def grouped_rows(g: Grouped, rows: torch.Tensor) -> Grouped:
    """The given output rows of a grouped weight (copies)."""
    def pick(t):
        return None if t is None else g.row_major(t, rows).contiguous()
    scale = pick(g.scale)
    offset = scale if g.offset is g.scale else pick(g.offset)  # Q6_K: one tensor for both
    return Grouped(pick(g.q), scale, offset, g.group, 8 if g.bits == 6 else g.bits,  # 6: row_major unpacks
                   pick(g.scale_super), pick(g.offset_super))


class SubsetHead(nn.Module):
    """Logits over the whole vocabulary from a head over `keep`'s rows only; -inf elsewhere."""

    def __init__(self, head: GroupedLinear, keep: torch.Tensor):
        super().__init__()
        if len(head.parts) != 1:
            raise ValueError("a subset head takes a one-part head")
        self.keep = keep.to(torch.long).sort().values
        self.out_features = head.out_features
        self.in_features = head.in_features
        bias = None if head.bias is None else head.bias.index_select(0, self.keep)
        self.head = GroupedLinear([grouped_rows(head.parts[0], self.keep)], bias, head.dtype, split=False)

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        small = self.head(x, exact)
        out = torch.full((*small.shape[:-1], self.out_features), float("-inf"), dtype=small.dtype)
        out.index_copy_(-1, self.keep, small)
        return out


def restrict_head(model: nn.Module, keep: torch.Tensor) -> int:
    """Swap model.lm_head (a GroupedLinear) for a SubsetHead over `keep`; returns the rows kept."""
    if not isinstance(model.lm_head, GroupedLinear):
        raise ValueError("a subset head needs a head on a GGUF's blocks")
    model.lm_head = SubsetHead(model.lm_head, keep)
    return int(model.lm_head.keep.numel())

