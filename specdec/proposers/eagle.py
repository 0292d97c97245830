"""EAGLE head (Li et al. 2024) with EAGLE-2 dynamic draft trees.

The head drafts at the feature level: fc(concat(target feature at t, embedding of token t+1))
-> one Llama decoder layer -> predicted target feature at t+1, which the target's own frozen
lm_head turns into a token distribution. It keeps its own KV cache over the sequence. Each
step it grows a tree: expand the top-k children of the most probable nodes for a few depths,
score nodes by the product of draft probabilities along their path, keep the best N."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.cache import KVCache
from specdec.models.config import ModelConfig
from specdec.models.llama import DecoderLayer, RMSNorm, rope_cos_sin, rope_inv_freq
from specdec.proposers.base import Proposal, read_head_config
from specdec.sampling import SamplingParams

EAGLE_TYPE = "specdec-eagle"


class EagleHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * d, d)
        self.layer = DecoderLayer(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.inv_freq = rope_inv_freq(config)  # float64, outside the buffers: .to(dtype) must not round it

    def new_cache(self, max_len: int) -> KVCache:
        c = self.config
        w = self.fc.weight
        return KVCache(1, c.num_key_value_heads, c.head_dim, max_len, w.dtype, w.device)

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """features, next_embeds: [B, T, d]; mask: full bool [T, cache.length + T] or None
        (causal). Returns predicted next features [B, T, d]."""
        x = self.fc(torch.cat([features, next_embeds], dim=-1))
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        if mask is None and cache is not None and x.shape[1] > 1:
            past = cache.length
            mask = torch.ones(x.shape[1], past + x.shape[1], dtype=torch.bool).tril(past)
        x = self.layer(x, cos, sin, mask, cache, 0)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.norm(x)


def save_eagle(head: EagleHead, folder: str | Path, meta: dict) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(folder / "model.safetensors"))
    cfg = {"model_type": EAGLE_TYPE, "head_config": head.config.to_hf_dict(), **meta}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_eagle(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[EagleHead, dict]:
    folder = Path(folder)
    cfg = read_head_config(folder, EAGLE_TYPE)
    head = EagleHead(ModelConfig.from_hf_dict(cfg["head_config"]))
    head.load_state_dict(load_file(str(folder / "model.safetensors")))
    return head.to(dtype).eval(), cfg


@dataclass
class TreeShape:
    top_k: int = 5  # children expanded per node
    depth: int = 7  # levels grown
    expand: int = 5  # nodes expanded per level (the most probable ones)
    nodes: int = 32  # N kept for verification (the controller may pick a smaller tree)


class EagleProposer:
    name = "eagle"
    shape = "tree"
    needs_hidden = True

    def __init__(self, head: EagleHead, embed: nn.Embedding, lm_head: nn.Module, max_len: int,
                 tree: TreeShape | None = None):
        self.head, self.embed, self.lm_head = head, embed, lm_head
        self.tree = tree or TreeShape()
        n = self.tree.nodes
        self.tree_sizes = sorted({min(s, n) for s in (4, 8, 16, n)})
        self.cache = head.new_cache(max_len + self.tree.depth * self.tree.expand + 8)
        self.committed = 0  # head cache positions that belong to the accepted sequence
        self.pending: list[torch.Tensor] = []  # target features not yet fed to the head

    def reset(self, prompt_ids: list[int]) -> None:
        self.cache.rollback(0)
        self.committed = 0
        self.pending = []

    def observe_target(self, hidden: torch.Tensor) -> None:
        self.pending.append(hidden)

    def accepted(self, num_drafted: int, num_accepted: int) -> None:
        pass

    def _logprobs(self, feats: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.lm_head(feats).float(), -1)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([])
        # 1. bring the head's cache up to date: pair each new target feature with the next token
        self.cache.rollback(self.committed)
        feats = torch.cat(self.pending) if self.pending else None
        self.pending = []
        if feats is None:
            return Proposal([])
        m = feats.shape[0]
        start = self.committed
        next_tokens = torch.tensor(context[start + 1:start + m + 1])
        out = self.head(feats[None], self.embed(next_tokens)[None], torch.arange(start, start + m), self.cache)
        self.committed += m
        # 2. grow the tree level by level (no deeper or wider than the node budget needs)
        shape = TreeShape(min(self.tree.top_k, k), min(self.tree.depth, k), min(self.tree.expand, k), k)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        entry: dict[int, int] = {}  # node -> its row in the head cache (when expanded)
        top = self._logprobs(out[0, -1]).topk(shape.top_k)
        for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
            tokens.append(tok), parents.append(-1), scores.append(lp)
        frontier = list(range(len(tokens)))
        parent_feat = {i: out[0, -1] for i in frontier}
        base = len(context) - 1  # position of the pending token
        for depth in range(1, shape.depth):
            frontier = sorted(frontier, key=lambda i: -scores[i])[:shape.expand]
            if not frontier:
                break
            mask = torch.zeros(len(frontier), self.cache.length + len(frontier), dtype=torch.bool)
            mask[:, :self.committed] = True
            for row, i in enumerate(frontier):
                mask[row, self.cache.length + row] = True
                a = parents[i]
                while a >= 0:
                    mask[row, entry[a]] = True
                    a = parents[a]
            for row, i in enumerate(frontier):
                entry[i] = self.cache.length + row
            x_feat = torch.stack([parent_feat[i] for i in frontier])[None]
            x_tok = self.embed(torch.tensor([tokens[i] for i in frontier]))[None]
            pos = torch.full((len(frontier),), base + depth - 1)
            pred = self.head(x_feat, x_tok, pos, self.cache, mask)[0]
            logp = self._logprobs(pred)
            new_frontier = []
            for row, i in enumerate(frontier):
                top = logp[row].topk(shape.top_k)
                for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
                    tokens.append(tok), parents.append(i), scores.append(scores[i] + lp)
                    parent_feat[len(tokens) - 1] = pred[row]
                    new_frontier.append(len(tokens) - 1)
            frontier = new_frontier
        # 3. keep the best k nodes (ancestor-closed: scores only fall along a path)
        keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:k]
        keep_set = set(keep)
        keep = [i for i in range(len(tokens)) if i in keep_set and
                (parents[i] < 0 or parents[i] in keep_set)]
        new_index = {old: new for new, old in enumerate(keep)}
        return Proposal([tokens[i] for i in keep], None,
                        [new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep])
