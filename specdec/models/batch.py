"""Batched passes of the native model: one forward over the running sequences of a batch,
each in its own KV-cache slot with its own positions and its own number of new tokens.

Decoding is bound by reading the weights, so one pass over the rows of B sequences costs far
less than B passes. Rows are packed through the projections (a slot with one row pays for one)
and padded to the widest slot inside attention, where a mask keeps every row to its own
slot's keys (one slot per batch row of the cache) and to its causal prefix; padding rows are
never written to the cache. In exact mode every row attends over exactly its keys as
exact.exact_attend_row defines it, all slots in one call (exact.attend_counted), and every
projection is row-invariant, so each row gets the bits a 1-token single-sequence pass in exact
mode gives it, whatever else is in the batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.models.cache import BatchKVCache
from specdec.models.exact import Counts, attend_counted
from specdec.models.linear import project
from specdec.models.llama import Attention, LlamaModel
from specdec.models.runner import tensor_bytes

# (slots attending with the shared mask, slots whose rows attend alone, their rows' key counts)
ExactRows = tuple[list[int], list[int], Counts]


SMALL_PASS_ROWS = 16  # decode and verify passes: attend_masked; wider (prefill chunks): SDPA


def attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, nh, T, hd] over k, v [B, nkv, L, hd] where mask [B, 1, T, L] allows, in at least
    float32: for a few query rows per slot SDPA's CPU kernel with a mask is slower, in float32
    too (measured here, 16 slots x 4 rows over 300 keys: 516 us this way, 2,958 us SDPA)."""
    B, nh, T, hd = q.shape
    nkv = k.shape[1]
    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = q.reshape(B, nkv, nh // nkv * T, hd).to(dtype) @ k.to(dtype).transpose(-1, -2)
    scores = (scores * hd ** -0.5).view(B, nkv, nh // nkv, T, -1).masked_fill(~mask[:, :, None], float("-inf"))
    out = scores.softmax(-1).view(B, nkv, nh // nkv * T, -1) @ v.to(dtype)
    return out.view(B, nh, T, hd).to(q.dtype)


def _attention(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
               cache: BatchKVCache, layer: int, exact_rows: ExactRows | None, exact: bool,
               rows: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """Attention for the packed rows x [1, R, d]: their queries are spread into the padded
    [n, heads, T, head_dim] layout (rows = (slot, row) of each packed row, shape = (n, T)),
    attend there, and come back packed."""
    q, k, v = attn.rotated_qkv(x, cos, sin, exact)  # [1, heads, R, head_dim]
    k, v = cache.update_rows(layer, k[0].transpose(0, 1), v[0].transpose(0, 1))
    slot, row = rows
    n, T = shape
    full = slot.numel() == n * T  # every slot as wide as the widest: packed is padded (a view)
    if full:
        queries = q[0].view(q.shape[1], n, T, q.shape[3]).transpose(0, 1)
    else:
        queries = q.new_zeros(n, q.shape[1], T, q.shape[3])  # padding rows: zeros, never read
        queries[slot, :, row] = q[0].transpose(0, 1)
    gqa = attn.nkv != attn.nh
    if exact_rows is None and shape[1] <= SMALL_PASS_ROWS:
        y = attend_masked(queries, k, v, mask)
    elif exact_rows is None:
        y = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask, enable_gqa=gqa)
    else:
        shared, alone, counts = exact_rows
        if not shared:  # every slot exact (no copy of the cache)
            y = attend_counted(queries, k, v, counts)
        else:
            y = torch.zeros_like(queries)
            idx = torch.tensor(shared, device=q.device)
            y[idx] = F.scaled_dot_product_attention(queries[idx], k[idx], v[idx], attn_mask=mask[idx], enable_gqa=gqa)
            idx = torch.tensor(alone, device=q.device)
            y[idx] = attend_counted(queries[idx], k[idx], v[idx], counts)
    y = y.transpose(0, 1).reshape(y.shape[1], n * T, y.shape[3]) if full else y[slot, :, row].transpose(0, 1)
    return attn.output(y[None], exact)


def batch_forward(model: LlamaModel, ids: list[list[int]], cache: BatchKVCache,
                  exact: list[bool] | None = None) -> torch.Tensor:
    """Append ids[b] to slot b of the cache for b in [0, len(ids)) in one pass; return the
    logits of every row, packed: [sum of len(ids[b]), V], slot b's after slot b-1's.
    exact[b]: slot b's rows are computed as 1-token passes would compute them.

    Rows are packed (no padding) through the projections, which cost by the row, and padded
    to the widest slot only inside attention: a slot verifying no drafts does not pay the
    projections for another's 8."""
    n, widths = len(ids), [len(r) for r in ids]
    T, device = max(widths), model.device
    end = cache.begin_pass(widths)
    slot, row, pos = cache.pass_rows()
    flat = torch.tensor([token for r in ids for token in r], dtype=torch.long, device=device)
    if model.stack is not None:  # GGUF blocks: every row exact, all layers in one kernel call (grouped_stack.py)
        write = pos.tolist()
        base = [b * cache.keys[0].stride(0) for b in slot.tolist()]
        x = model.stack(model.model.embed_tokens(flat), pos, model.rope, cache.keys, cache.values, base, write,
                        [p + 1 for p in write])
        cache.end_pass(widths)
        return project(model.lm_head, model.model.norm(x), True)
    cos, sin = model.rope(pos[None], model.dtype, device)
    any_exact = exact is not None and any(exact)
    mask = None  # only slots outside exact mode attend with it
    if not any_exact or not all(exact):
        starts = torch.tensor(cache.lengths[:n], device=device)
        positions = starts[:, None] + torch.arange(T, device=device)  # padded: padding rows finite, never read
        mask = (torch.arange(end, device=device) <= positions[:, :, None])[:, None]  # [n, 1, T, end]
    exact_rows = None
    if any_exact:
        alone = [b for b in range(n) if exact[b]]
        # row t of slot b sees the slot's keys and its rows up to t
        counts = tuple(tuple(cache.lengths[b] + t + 1 for t in range(widths[b])) for b in alone)
        exact_rows = ([b for b in range(n) if not exact[b]], alone, counts)
    x = model.model.embed_tokens(flat)[None]  # [1, R, d]
    for i, layer in enumerate(model.model.layers):
        x = x + _attention(layer.self_attn, layer.input_layernorm(x), cos, sin, mask, cache, i, exact_rows, any_exact,
                           (slot, row), (n, T))
        x = x + layer.mlp(layer.post_attention_layernorm(x), any_exact)
    cache.end_pass(widths)
    return project(model.lm_head, model.model.norm(x), any_exact)[0]


class BatchRunner:
    """The target of a batched engine: a native model (shared with the single-sequence
    NativeRunner, already fused) and a KV cache of max_batch slots."""

    def __init__(self, model: LlamaModel, max_batch: int, max_len: int):
        c = model.config
        self.model = model
        self.max_batch = max_batch
        self.max_len = max_len
        self.vocab_size = c.vocab_size
        self.cache = BatchKVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, max_len,
                                  model.dtype, model.device, max_batch)

    def length(self, slot: int) -> int:
        return self.cache.lengths[slot]

    @torch.inference_mode()
    def extend(self, ids: list[list[int]], exact: list[bool] | None = None) -> list[torch.Tensor]:
        """One pass over slots [0, len(ids)); per slot the logits [len(ids[b]), V] of its rows."""
        logits = batch_forward(self.model, ids, self.cache, exact)
        return list(logits.split([len(row) for row in ids]))

    @torch.inference_mode()
    def extend_slot(self, slot: int, ids: list[int], exact: bool = False,
                    want_logits: bool = True) -> torch.Tensor | None:
        """A single-sequence pass on one slot (a prefill chunk): the very computation
        NativeRunner.extend does, on that slot's cache. Logits [len(ids), V] (None when not
        want_logits: the LM head skipped)."""
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        logits = self.model(x, None, self.cache.slot(slot), exact=exact, want_logits=want_logits)
        return None if logits is None else logits[0]

    def rollback(self, slot: int, length: int) -> None:
        self.cache.rollback(slot, length)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)

    def memory_bytes(self) -> int:
        """Bytes of the batch cache (the weights are the single runner's)."""
        return tensor_bytes([*self.cache.keys, *self.cache.values])
