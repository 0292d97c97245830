"""Native Llama-family decoder (llama, mistral, qwen2) in one small file, in the spirit of
gpt-fast/nanoGPT. Module names mirror the Hugging Face checkpoint names, so loading is a
plain state-dict copy and saving gives a folder `transformers` reads unchanged."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.cache import KVCache, PassAttention
from specdec.models.compiled import compiled_forward, use_compiled
from specdec.models.config import ModelConfig
from specdec.models.exact import TreeRows, attend_row, attend_rows, exact_attend_row, exact_row_keys
from specdec.models.linear import FusedLinear, pack_linears, project
from specdec.models.packed import pack_weight
from specdec.models.rope import RopeTable, apply_rope, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalised in float32, rounded, then scaled: Hugging Face's order (F.rms_norm gives
        # the same bits as the written-out form here, in one call instead of five)
        dtype = x.dtype
        x = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        return self.weight * F.rms_norm(x, x.shape[-1:], eps=self.eps).to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hd, nh, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, nh * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, nkv * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, nkv * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(nh * hd, config.hidden_size, bias=False)
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.qkv: FusedLinear | None = None  # set by fuse(): one matmul instead of three

    def fuse(self) -> None:
        if self.qkv is None:  # a quantized model arrives fused
            self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj])

    def rotated_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    exact: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, heads, T, head_dim], rope applied to q and k (also used by the
        batched pass, models/batch.py)."""
        B, T, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        if self.qkv is not None:  # q and k rotated in one go, as heads of one tensor
            qkv = self.qkv.product(x, exact)
            qk = apply_rope(qkv[..., :(nh + nkv) * hd].view(B, T, nh + nkv, hd), cos, sin)
            q, k = qk[:, :, :nh], qk[:, :, nh:]
            v = qkv[..., (nh + nkv) * hd:].view(B, T, nkv, hd)
        else:
            q, k, v = (project(p, x, exact) for p in (self.q_proj, self.k_proj, self.v_proj))
            q = apply_rope(q.view(B, T, nh, hd), cos, sin)
            k = apply_rope(k.view(B, T, nkv, hd), cos, sin)
            v = v.view(B, T, nkv, hd)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def output(self, y: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The heads' outputs [B, heads, T, head_dim] through o_proj."""
        B, _, T, _ = y.shape
        return project(self.o_proj, y.transpose(1, 2).reshape(B, T, self.nh * self.hd), exact)

    def forward(self, x, cos, sin, mask, cache: KVCache | None, layer: int,
                row_keys: list[int] | TreeRows | None = None, exact: bool = False) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.rotated_qkv(x, cos, sin, exact)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        if isinstance(cache, PassAttention):  # a batched pass: its slots' attention (models/batch.py)
            y = cache.attend(q, k, v)
        elif row_keys is not None:
            y = attend_rows(q, k, v, row_keys)
        elif T == 1 and mask is None:  # a decode step: SDPA's kernel is slow for one query
            y = exact_attend_row(q, k, v) if exact else attend_row(q, k, v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and cache is None and T > 1,
                enable_gqa=self.nkv != self.nh)
        return self.output(y, exact)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up: FusedLinear | None = None  # set by fuse()

    def fuse(self) -> None:
        if self.gate_up is None:
            self.gate_up = FusedLinear([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x, exact)
        else:
            gate, up = project(self.gate_proj, x, exact), project(self.up_proj, x, exact)
        return project(self.down_proj, F.silu(gate) * up, exact)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, layer, row_keys=None, exact: bool = False):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer, row_keys, exact)
        return x + self.mlp(self.post_attention_layernorm(x), exact)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """forward(ids, positions, cache, attn_mask) -> logits (and final hidden states).

    ids: [B, T]; positions: [T] or [B, T]; attn_mask: optional bool [T, T] over the new tokens
    (True = may attend), e.g. a tree mask; without it the new tokens are causal. Every new
    token always sees the whole cache prefix."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = RopeTable(rope_inv_freq(config))
        self.compiled: Callable | None = None  # set by compile_forward()
        self.stack: Callable | None = None  # all layers in one kernel call (stack.py)
        self.fast_paths = None  # stack.FastPaths: where fast passes run (None: on the stack where there is one)
        self.apply(self._init_weights)
        for layer in self.model.layers:  # GPT-2 style: residual projections scaled by depth
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * config.num_hidden_layers))

    @property
    def exact_is_free(self) -> bool:
        """Whether an exact pass costs what a fast one does: every pass on the one-call stack
        can be (its rows are exact by construction, whatever the pass width)."""
        return self.stack is not None and self.compiled is None

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def fuse_projections(self) -> LlamaModel:
        """Q/K/V and gate/up as one matmul each (for inference; see FusedLinear). Call after
        the final .to(dtype/device): moving the model afterwards would un-share the weights."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def pack_weights(self) -> LlamaModel:
        """Pack the projections' weights (bfloat16, float32) for oneDNN once (see packed.py),
        for inference: a decode pass then reads them instead of repacking each weight per
        call. Call after fuse_projections(). Costs the packed copies' memory beside the
        weights (which state_dict(), saving and training keep)."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for fused in (attn.qkv, mlp.gate_up):
                if fused is not None:
                    fused.packed = pack_weight(fused.weight, fused.bias)
            pack_linears(attn, *(("q_proj", "k_proj", "v_proj") if attn.qkv is None else ()), "o_proj")
            pack_linears(mlp, *(("gate_proj", "up_proj") if mlp.gate_up is None else ()), "down_proj")
        return self.pack_lm_head()

    def pack_lm_head(self) -> LlamaModel:
        pack_linears(self, "lm_head")
        return self

    def compile_forward(self, cpp_wrapper: bool = False) -> LlamaModel:
        """Run fast (not exact) inference passes, from the embedding to the logits, through
        inductor (models/compiled.py; cpp_wrapper: see compiled_forward). Call after the final
        change to the weights: they are frozen into the compiled code."""
        self.compiled = compiled_forward(self.model.embed_tokens, self.model.layers, self.model.norm,
                                         lambda h: project(self.lm_head, h, False), cpp_wrapper)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype  # norms are never quantized

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def new_cache(self, max_len: int | None = None, batch_size: int = 1) -> KVCache:
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                       max_len or c.max_position_embeddings, self.dtype, self.device, batch_size)

    def _pass_inputs(self, ids: torch.Tensor, positions: torch.Tensor | None, cache: KVCache | None,
                     attn_mask: torch.Tensor | None, exact: bool):
        """cos, sin, the attention mask over [cache + new tokens] (None: causal or one row) and,
        for exact passes, each row's keys (exact_row_keys)."""
        T = ids.shape[1]
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + T, device=ids.device)
        cos, sin = self.rope(positions, self.dtype, self.device)
        row_keys = exact_row_keys(T, past, attn_mask) if exact and cache is not None and T > 1 else None
        mask = None  # also when each row attends alone (row_keys)
        if row_keys is None and attn_mask is not None:
            mask = torch.cat([torch.ones(T, past, dtype=torch.bool, device=ids.device),
                              attn_mask.to(torch.bool)], dim=1)
        elif row_keys is None and cache is not None and T > 1:
            mask = torch.ones(T, past + T, dtype=torch.bool, device=ids.device).tril(past)
        return cos, sin, mask, row_keys

    def hidden_states(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                      cache: KVCache | None = None,
                      attn_mask: torch.Tensor | None = None, exact: bool = False) -> torch.Tensor:
        """The final-norm hidden states, eagerly. exact: every row's attention is computed as a
        1-token pass would (see exact.attend_rows), so that each row's output does not depend
        on how many rows the pass holds."""
        if self.stack is not None and cache is not None and ids.shape[0] == 1 and cache.layout() is not None \
                and (exact or self.fast_paths is None or self.fast_paths.use_stack(ids.shape[1])):
            return self._stack_states(ids, positions, cache, attn_mask)
        cos, sin, mask, row_keys = self._pass_inputs(ids, positions, cache, attn_mask, exact)
        h = self.layer_states(ids, cos, sin, cache, exact, mask, row_keys)
        if cache is not None:
            cache.advance(ids.shape[1])
        return h

    def layer_states(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     cache: KVCache | PassAttention | None, exact: bool = False, mask: torch.Tensor | None = None,
                     row_keys: list[int] | TreeRows | None = None) -> torch.Tensor:
        """Embedding, every DecoderLayer and the final norm: the one eager forward path, for a
        sequence's pass (cache: its KVCache) and a batched one (cache: a PassAttention)."""
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i, row_keys, exact)
        return self.model.norm(x)

    def _stack_states(self, ids: torch.Tensor, positions: torch.Tensor | None, cache: KVCache,
                      attn_mask: torch.Tensor | None) -> torch.Tensor:
        """hidden_states through the one-call stack: every row as exact mode computes it, always."""
        past = cache.length
        positions = torch.arange(past, past + ids.shape[1]) if positions is None else positions
        # a tree: each row sees the cache and its ancestors
        lists = None if attn_mask is None else TreeRows(past, attn_mask.to(torch.bool)).key_lists
        return self.stack.extend(self.model.embed_tokens(ids)[0], positions, self.rope, cache, lists)[None]  # normed

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, attn_mask: torch.Tensor | None = None,
                return_hidden: bool = False, exact: bool = False, want_logits: bool = True,
                last_logits: bool = False):
        """Logits [B, T, V] (and the final-norm hidden states with return_hidden). want_logits=False
        skips the LM head on the eager path (logits None): a prefill needs only the cache, and
        the head is a fifth of SmolLM2's weights; last_logits runs it over the last row only
        (logits [B, 1, V]: a draft's catch-up pass needs no more). The compiled graph always
        includes every row's."""
        past = cache.length if cache is not None else 0
        if self.compiled is not None and use_compiled(ids.shape[1], past, exact, cache, self.device):
            cos, sin, mask, _ = self._pass_inputs(ids, positions, cache, attn_mask, exact)
            logits, h = self.compiled(ids, cos, sin, mask, cache)
            cache.advance(ids.shape[1])
        else:
            h = self.hidden_states(ids, positions, cache, attn_mask, exact)
            logits = project(self.lm_head, h[:, -1:] if last_logits else h, exact) if want_logits else None
        return (logits, h) if return_hidden else logits
