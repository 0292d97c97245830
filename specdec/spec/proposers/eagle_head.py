"""The EAGLE head (Li et al. 2024): fc(concat(target feature at t, embedding of token t+1)) -> one
Llama decoder layer -> the predicted target feature at t+1, read by the target's lm_head or the
head's own over a reduced draft vocabulary; saved in a Hugging Face-style folder. The drafting
(EAGLE-2 dynamic trees) is spec/proposers/eagle.py's."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specdec.kernels import invariant
from specdec.models.cache import KVCache
from specdec.models.config import ModelConfig
from specdec.models.group_quant import GROUP, grouped_linear
from specdec.models.linear import pack_linears, project
from specdec.models.llama import DecoderLayer, RMSNorm
from specdec.models.packed import pack_weight
from specdec.models.rope import RopeTable, rope_inv_freq
from specdec.models.stack import LayerStack, dense_layer_stack, kernel_takes
from specdec.spec.proposers.head_folder import load_head, save_head

EAGLE_TYPE = "specdec-eagle"


class EagleHead(nn.Module):
    """draft_vocab > 0: the head has its own output projection over that many tokens (the
    d2t buffer maps them to target ids, draft_vocab.py); 0: drafts use the target's lm_head."""

    def __init__(self, config: ModelConfig, draft_vocab: int = 0):
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * d, d)
        self.layer = DecoderLayer(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rope = RopeTable(rope_inv_freq(config))
        self.lm_head: nn.Module | None = None  # nn.Linear, a PackedLinear once packed
        # the layer in one kernel call (models/stack.py), once packed for inference: through the
        # PyTorch layer a head pass cost ~1.2 ms (~25 framework calls), two of them in a 2-node
        # draft of 3.4 ms on SmolLM2 here; through the stack ~0.5 ms
        self.stack: LayerStack | None = None
        self.four_bit = False  # projections rounded to 4 bits (round_to_4bit)
        if draft_vocab:
            self.lm_head = nn.Linear(d, draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))

    @property
    def draft_vocab(self) -> int:
        return 0 if self.lm_head is None else self.lm_head.out_features

    def pack_weights(self) -> EagleHead:
        """For inference, as LlamaModel.pack_weights: the layer's projections fused, weights
        packed once for oneDNN (a head pass is a few small matmuls, each of which
        otherwise repacks its weight)."""
        self.layer.self_attn.fuse()
        self.layer.mlp.fuse()
        for fused in (self.layer.self_attn.qkv, self.layer.mlp.gate_up):
            fused.packed = pack_weight(fused.weight, fused.bias)
        pack_linears(self, "fc", "lm_head")
        pack_linears(self.layer.self_attn, "o_proj")
        pack_linears(self.layer.mlp, "down_proj")
        self.stack = dense_layer_stack([self.layer], self.config, self.fc.weight.dtype, self.norm)
        return self

    def round_to_4bit(self) -> bool:
        """The packed head's projections (fc, its layer's, its own lm_head) rounded to 4 bits for
        the grouped kernels (models/group_quant.py: groups of 32 inputs with a scale and an
        offset), its layer on the grouped stack: a draft level reads about a quarter of the bytes
        (SmolLM2's head, 8-node trees at T=0: 3.7 -> 2.4 ms of drafting a step, acceptance
        unchanged). Lossless, as any draft: verification decides. False, and the head unchanged,
        where the kernels do not take them (not packed, another dtype, widths not a multiple of 32)."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        names = [(self, "fc"), (attn, "qkv"), (attn, "o_proj"), (mlp, "gate_up"), (mlp, "down_proj")]
        names += [(self, "lm_head")] if self.lm_head is not None else []
        linears = [getattr(owner, name) for owner, name in names]
        if self.stack is None or any(not isinstance(getattr(lin, "weight", None), torch.Tensor)
                                     or lin.weight.shape[1] % GROUP for lin in linears):
            return False
        rounded = [grouped_linear(lin, "int4") for lin in linears]
        if not all(kernel_takes(part) for lin in rounded for part in lin.parts):
            return False
        for (owner, name), lin in zip(names, rounded):
            setattr(owner, name, lin)
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj  # the fused ones' float parts
        self.stack = LayerStack([self.layer], self.config, self.fc.dtype, self.stack.lib, self.norm)
        self.four_bit = True
        return True

    @property
    def row_invariant(self) -> bool:
        """Whether every row of a head pass has the same bits however many rows the pass holds:
        rounded to 4 bits, each projection and the layer run on kernels built so."""
        return self.four_bit

    def new_cache(self, max_len: int) -> KVCache:
        c = self.config
        w = self.norm.weight  # in the head's dtype, rounded projections or not
        return KVCache(1, c.num_key_value_heads, c.head_dim, max_len, w.dtype, w.device)

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """features, next_embeds: [B, T, d]; mask: full bool [T, cache.length + T] or None
        (causal). Returns predicted next features [B, T, d]."""
        x = project(self.fc, torch.cat([features, next_embeds], dim=-1), exact=False)
        if self.stack is not None and cache is not None and x.shape[0] == 1 and cache.layout() is not None:
            return self._stack_forward(x[0], positions, cache, mask)[None]
        cos, sin = self.rope(positions, x.dtype, x.device)
        if mask is None and cache is not None and x.shape[1] > 1:
            past = cache.length
            mask = torch.ones(x.shape[1], past + x.shape[1], dtype=torch.bool).tril(past)
        x = self.layer(x, cos, sin, mask, cache, 0)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.norm(x)

    def _stack_forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       mask: torch.Tensor | None) -> torch.Tensor:
        """forward's layer through the one-call stack: rows x [T, d] written after the cache's
        entries, each attending causally or, with mask, to the positions its row of mask holds."""
        lists = None if mask is None else invariant.key_lists([row.nonzero()[:, 0] for row in mask])
        return self.stack.extend(x, positions, self.rope, cache, lists)  # the norm in the same call


def save_eagle(head: EagleHead, folder: str | Path, meta: dict) -> None:
    """meta: the tree shape, measured accuracies and training facts, stored after the shape."""
    save_head(head, folder, {"model_type": EAGLE_TYPE, "head_config": head.config.to_hf_dict(),
                             "draft_vocab_size": head.draft_vocab, **meta})


def load_eagle(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[EagleHead, dict]:
    return load_head(folder, EAGLE_TYPE, lambda cfg: EagleHead(ModelConfig.from_hf_dict(cfg["head_config"]),
                                                               cfg.get("draft_vocab_size", 0)), dtype)
