"""Medusa heads (Cai et al. 2024): head k reads the target's last hidden state and predicts
the token k+1 positions ahead through the target's own (frozen) lm_head. Their top
candidates form a tree the target verifies in one pass; drafting costs almost nothing."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.models.linear import pack_linears, project
from specdec.models.packed import packed_bytes
from specdec.models.runner import tensor_bytes
from specdec.sampling import SamplingParams, draw_distinct, final_probs
from specdec.sampling.penalties import TokenHistory, adjust_logits
from specdec.sampling.seeded import PositionNoise
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.head_folder import load_head, save_head
from specdec.spec.proposers.trees import node_budgets, tree_from_choices

MEDUSA_TYPE = "specdec-medusa"


class ResBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.zeros_(self.linear.weight)  # starts as identity: predicts like lm_head
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.silu(project(self.linear, x, exact=False))


class MedusaHeads(nn.Module):
    def __init__(self, num_heads: int, hidden_size: int):
        super().__init__()
        self.heads = nn.ModuleList(ResBlock(hidden_size) for _ in range(num_heads))

    def pack_weights(self) -> MedusaHeads:
        """Weights packed once for oneDNN, for inference (see LlamaModel.pack_weights)."""
        for head in self.heads:
            pack_linears(head, "linear")
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [num_heads, ..., d] features for the shared lm_head."""
        return torch.stack([h(hidden) for h in self.heads])


def save_medusa(heads: MedusaHeads, folder: str | Path, meta: dict) -> None:
    """meta: the tree, measured accuracies and training facts, stored after the shape."""
    save_head(heads, folder, {"model_type": MEDUSA_TYPE, "num_heads": len(heads.heads),
                              "hidden_size": heads.heads[0].linear.in_features, **meta})


def load_medusa(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[MedusaHeads, dict]:
    return load_head(folder, MEDUSA_TYPE, lambda cfg: MedusaHeads(cfg["num_heads"], cfg["hidden_size"]), dtype)


class MedusaProposer:
    name = "medusa"
    shape = "tree"
    needs_hidden = True
    tree_floor = 0

    def __init__(self, heads: MedusaHeads, lm_head: nn.Module, choices: list[tuple[int, ...]],
                 tree_sizes: list[int] | None = None):
        if not choices:
            raise SpecdecError("the Medusa tree is empty")
        if max(len(c) for c in choices) > len(heads.heads):
            raise SpecdecError("the Medusa tree is deeper than the number of heads")
        self.heads, self.lm_head = heads, lm_head
        self.choices = [tuple(c) for c in choices]
        self.max_rank = [1 + max((c[d] for c in self.choices if len(c) > d), default=0)
                         for d in range(len(heads.heads))]
        self.tree_sizes = tree_sizes or node_budgets(len(self.choices))
        self.last_hidden: torch.Tensor | None = None

    def memory_bytes(self) -> int:
        return tensor_bytes(self.heads.parameters()) + packed_bytes(self.heads)  # lm_head is the target's own

    def fork(self) -> MedusaProposer:
        """A proposer for another sequence: the same heads, its own last hidden state."""
        return MedusaProposer(self.heads, self.lm_head, self.choices, self.tree_sizes)

    def reset(self, prompt_ids: list[int], kept_features: int = 0) -> None:
        self.last_hidden = None  # the next pass's (a kept prefix's features are never read)

    def features_kept(self) -> None:
        """None: no earlier position's feature is read, so any cached prefix may be kept."""
        return None

    def observe_target(self, hidden: torch.Tensor) -> None:
        self.last_hidden = hidden[-1]

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None) -> Proposal:
        """Greedy: the heads' top candidates. Sampling: each depth's candidates are drawn
        without replacement from that head's final distribution (all nodes of a depth share
        them), which the verifier uses to accept with min(1, p/q)."""
        if self.last_hidden is None or k <= 0:
            return Proposal([])
        choices = self.choices[:k]
        depth = max(len(c) for c in choices)
        logits = project(self.lm_head, self.heads(self.last_hidden)[:depth], exact=False)  # [depth, V]
        ranks = self.max_rank[:depth]
        if history is not None:
            return self._propose_penalized(choices, logits, ranks, params, generator, history,
                                           len(context), noise)
        if params.greedy:
            candidates = [logits[d].topk(ranks[d]).indices.tolist() for d in range(depth)]
            tokens, parents = tree_from_choices(choices, candidates)
            return Proposal(tokens, None, parents)
        # head d drafts the token at position len(context) + d
        exponentials = None if noise is None else noise.rows(list(range(len(context), len(context) + depth)))
        drawn, q = draw_distinct(final_probs(logits, params), max(ranks), generator, exponentials=exponentials)
        candidates = [drawn[d][:ranks[d]] for d in range(depth)]
        tokens, parents = tree_from_choices(choices, candidates)
        draft_probs = torch.zeros(len(tokens) + 1, q.shape[-1], dtype=q.dtype)
        draws: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
        node_depth = [0]  # by row: the root, then each node
        for p in parents:
            node_depth.append(node_depth[p + 1] + 1)
        for row in {p + 1 for p in parents}:  # nodes with children draw them from q[depth]
            draft_probs[row] = q[node_depth[row]]
            draws[row] = candidates[node_depth[row]]
        return Proposal(tokens, draft_probs, parents, draws)

    def _propose_penalized(self, choices: list[tuple[int, ...]], logits: torch.Tensor, ranks: list[int],
                           params: SamplingParams, generator: torch.Generator | None,
                           history: TokenHistory, position: int = 0,
                           noise: PositionNoise | None = None) -> Proposal:
        """With penalties a head's distribution at a node depends on the node's path (as the
        target's does), so nodes of one depth no longer share candidates: the tree is built
        level by level, each expanded node getting its own adjusted row and its own candidates
        (the top ranks when greedy, drawn without replacement when sampling). position: where
        depth 0's tokens go (len(context)), for the seeded races' noise."""
        tokens: list[int] = []
        parents: list[int] = []
        paths: list[list[int]] = [[]]  # paths[1 + i]: node i's path from the root; [0]: the root's
        index: dict[tuple[int, ...], int] = {(): -1}  # choice -> node (-1: the root)
        candidates: dict[int, list[int]] = {}  # expanded node -> its ranked candidates / draws
        q_rows: dict[int, torch.Tensor] = {}
        for d, rank in enumerate(ranks):
            level = [c for c in choices if len(c) == d + 1 and c[:-1] in index]
            expanded = list(dict.fromkeys(index[c[:-1]] for c in level))
            if not expanded:
                break
            rows = history.rows([paths[node + 1] for node in expanded])
            head_logits = logits[d].expand(len(expanded), -1)
            if params.greedy:
                ranked = adjust_logits(head_logits, params, rows).topk(rank, dim=-1).indices.tolist()
            else:
                exponentials = None if noise is None else noise.rows([position + d] * len(expanded))
                ranked, q = draw_distinct(final_probs(head_logits, params, rows), rank, generator,
                                          exponentials=exponentials)
                q_rows.update(zip(expanded, q))
            candidates.update(zip(expanded, ranked))
            for choice in level:
                parent = index[choice[:-1]]
                if choice[-1] < len(candidates[parent]):
                    index[choice] = len(tokens)
                    tokens.append(candidates[parent][choice[-1]])
                    parents.append(parent)
                    paths.append(paths[parent + 1] + [tokens[-1]])
        if params.greedy:
            return Proposal(tokens, None, parents)
        draft_probs = torch.zeros(len(tokens) + 1, logits.shape[-1], dtype=next(iter(q_rows.values())).dtype)
        draws: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
        for node, q in q_rows.items():
            draft_probs[node + 1] = q
            draws[node + 1] = candidates[node]
        return Proposal(tokens, draft_probs, parents, draws)
