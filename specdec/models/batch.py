"""Batched passes of the native model: one forward over the running sequences of a batch,
each in its own KV-cache slot with its own positions and its own number of new tokens.

Decoding is bound by reading the weights, so one pass over the rows of B sequences costs far
less than B passes. Rows are packed through the projections (a slot with one row pays for one)
and padded to the widest slot inside attention, where a mask keeps every row to its own
slot's keys (one slot per batch row of the cache) and to its causal prefix; padding rows are
never written to the cache. In exact mode every row attends over exactly its keys as
exact.exact_attend_row defines it, all slots in one call (exact.attend_counted), and every
projection is row-invariant, so each row gets the bits a 1-token single-sequence pass in exact
mode gives it, whatever else is in the batch. The pass runs the model's own layers
(LlamaModel.layer_states) with a BatchPass in place of a cache, or the one-call stack."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.kernels import invariant
from specdec.models.cache import BatchKVCache, PassAttention, PassPlan
from specdec.models.exact import Counts, TreeRows, attend_counted, attend_rows
from specdec.models.linear import project
from specdec.models.llama import LlamaModel
from specdec.models.runner import tensor_bytes

# (slots attending with the shared mask, chain slots whose rows attend alone, their rows' key
# counts, tree slots whose rows attend alone: (slot, the tree's rows))
ExactRows = tuple[list[int], list[int], Counts, list[tuple[int, TreeRows]]]


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


class BatchPass(PassAttention):
    """What a batched pass's attention needs, handed to the model's layers in place of a cache
    (Attention.forward calls update, then attend): the packed rows' keys and values go into
    their slots, and each slot's queries attend there, padded to the widest slot."""

    def __init__(self, cache: BatchKVCache, mask: torch.Tensor | None, exact_rows: ExactRows | None,
                 rows: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, int]):
        self.cache, self.mask, self.exact_rows = cache, mask, exact_rows
        self.rows, self.shape = rows, shape  # (slot, row) of each packed row; (slots n, widest T)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [1, heads, R, head_dim] of the packed rows into their slots; every slot's [n, heads, L, hd]."""
        return self.cache.update_rows(layer, k[0].transpose(0, 1), v[0].transpose(0, 1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The packed queries q [1, heads, R, head_dim] spread into the padded [n, heads, T,
        head_dim] layout, attended there over their slots' keys, and packed again."""
        slot, row = self.rows
        n, T = self.shape
        mask, exact_rows = self.mask, self.exact_rows
        full = slot.numel() == n * T  # every slot as wide as the widest: packed is padded (a view)
        if full:
            queries = q[0].view(q.shape[1], n, T, q.shape[3]).transpose(0, 1)
        else:
            queries = q.new_zeros(n, q.shape[1], T, q.shape[3])  # padding rows: zeros, never read
            queries[slot, :, row] = q[0].transpose(0, 1)
        gqa = k.shape[1] != q.shape[1]
        if exact_rows is None and T <= SMALL_PASS_ROWS:
            y = attend_masked(queries, k, v, mask)
        elif exact_rows is None:
            y = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask, enable_gqa=gqa)
        else:
            shared, alone, counts, trees = exact_rows
            if not shared and not trees:  # every slot an exact chain (no copy of the cache)
                y = attend_counted(queries, k, v, counts)
            else:
                y = torch.zeros_like(queries)
                if shared:
                    idx = torch.tensor(shared, device=q.device)
                    y[idx] = F.scaled_dot_product_attention(queries[idx], k[idx], v[idx], attn_mask=mask[idx],
                                                            enable_gqa=gqa)
                if alone:
                    idx = torch.tensor(alone, device=q.device)
                    y[idx] = attend_counted(queries[idx], k[idx], v[idx], counts)
                for b, tree in trees:  # each row over its own keys: the cache's and its ancestors'
                    width = tree.seen.shape[0]
                    y[b:b + 1, :, :width] = attend_rows(queries[b:b + 1, :, :width], k[b:b + 1], v[b:b + 1], tree)
        y = y.transpose(0, 1).reshape(y.shape[1], n * T, y.shape[3]) if full else y[slot, :, row].transpose(0, 1)
        return y[None]


def batch_forward(model: LlamaModel, plan: PassPlan, cache: BatchKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Append plan.rows[b] to slot b of the cache for b in [0, len(plan.rows)) in one pass;
    return the logits and final-norm hidden states of every row, packed: [sum of
    len(plan.rows[b]), V] and [..., d], slot b's after slot b-1's. plan.exact[b]: slot b's rows
    are computed as 1-token passes would compute them. plan.trees[b] (None: a chain): slot b's
    rows are a tree, seen [T_b, T_b] bool (row t sees the rows of itself and its ancestors, as
    verify.tree_attention_mask): each row at the position of its depth, attending to the slot's
    cache and its ancestors.

    Rows are packed (no padding) through the projections, which cost by the row, and padded
    to the widest slot only inside attention: a slot verifying no drafts does not pay the
    projections for another's 8."""
    ids, exact = plan.rows, plan.exact
    n, widths = len(ids), [len(r) for r in ids]
    T, device = max(widths), model.device
    trees = plan.trees or [None] * n
    starts = cache.lengths[:n]
    end = cache.begin_pass(widths)
    slot, row, pos = cache.pass_rows()
    rope_pos = pos
    if any(tree is not None for tree in trees):  # a tree row's position is its depth's
        depths = [(tree.sum(1) - 1).tolist() if tree is not None else range(w) for tree, w in zip(trees, widths)]
        rope_pos = torch.tensor([starts[b] + d for b in range(n) for d in depths[b]], device=device)
    flat = torch.tensor([token for r in ids for token in r], dtype=torch.long, device=device)
    fast = model.fast_paths
    if model.stack is not None and (fast is None or exact is not None and any(exact) or fast.use_stack(len(flat))):
        # all layers in one kernel call (models/stack.py), every row exact
        write = pos.tolist()
        base = [b * cache.keys[0].stride(0) for b in slot.tolist()]
        lists = None
        if any(tree is not None for tree in trees):
            lists = invariant.key_lists([key for b in range(n) for key in _row_keys(starts[b], widths[b], trees[b])])
        x = model.stack(model.model.embed_tokens(flat), rope_pos, model.rope, cache.keys, cache.values, base, write,
                        [p + 1 for p in write] if lists is None else lists.lengths, lists)
        cache.end_pass(widths)  # x: the final hidden states (the stack's last step is the final norm)
        return project(model.lm_head, x, True), x
    cos, sin = model.rope(rope_pos[None], model.dtype, device)
    any_exact = exact is not None and any(exact)
    mask = None  # only slots outside exact mode attend with it
    if not any_exact or not all(exact):
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)  # padded: finite
        mask = (torch.arange(end, device=device) <= positions[:, :, None])[:, None]  # [n, 1, T, end]
        for b, tree in enumerate(trees):
            if tree is not None:
                mask[b, 0, :widths[b], starts[b]:starts[b] + widths[b]] = tree
    exact_rows = None
    if any_exact:
        alone = [b for b in range(n) if exact[b] and trees[b] is None]
        # row t of slot b sees the slot's keys and its rows up to t
        counts = tuple(tuple(starts[b] + t + 1 for t in range(widths[b])) for b in alone)
        exact_trees = [(b, TreeRows(starts[b], trees[b])) for b in range(n) if exact[b] and trees[b] is not None]
        exact_rows = ([b for b in range(n) if not exact[b]], alone, counts, exact_trees)
    # the model's own layers (DecoderLayer.forward), this pass's attention in place of a cache
    h = model.layer_states(flat[None], cos, sin, BatchPass(cache, mask, exact_rows, (slot, row), (n, T)), any_exact)
    cache.end_pass(widths)
    return project(model.lm_head, h, any_exact)[0], h[0]


def _row_keys(start: int, width: int, tree: torch.Tensor | None) -> list[torch.Tensor]:
    """The cache positions each of a slot's new rows attends to, in cache order."""
    if tree is None:
        return [torch.arange(start + t + 1) for t in range(width)]
    return TreeRows(start, tree).positions


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
        self.last_hidden: list[torch.Tensor] = []  # per slot of the last pass (extend_slot: one)

    def length(self, slot: int) -> int:
        return self.cache.lengths[slot]

    @torch.inference_mode()
    def forward(self, plan: PassPlan) -> list[torch.Tensor]:
        """One pass over the plan's slots; per slot the logits [len(plan.rows[b]), V] of its
        rows; their final hidden states per slot in last_hidden (always: they cost nothing
        more here)."""
        logits, hidden = batch_forward(self.model, plan, self.cache)
        widths = [len(row) for row in plan.rows]
        self.last_hidden = list(hidden.split(widths))
        return list(logits.split(widths))

    @torch.inference_mode()
    def extend_slot(self, slot: int, ids: list[int], exact: bool = False,
                    want_logits: bool = True, want_hidden: bool = True) -> torch.Tensor | None:
        """A single-sequence pass on one slot (a prefill chunk): the very computation
        NativeRunner.extend does, on that slot's cache. Logits [len(ids), V] (None when not
        want_logits: the LM head skipped). The hidden states are kept whatever want_hidden says
        (OneSlotRunner's interface): the pass computes them anyway."""
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        logits, hidden = self.model(x, None, self.cache.slot(slot), exact=exact, want_logits=want_logits,
                                    return_hidden=True)
        self.last_hidden = [hidden[0]]
        return None if logits is None else logits[0]

    def rollback(self, slot: int, length: int) -> None:
        self.cache.rollback(slot, length)

    def keep(self, slot: int, start: int, offsets: list[int]) -> None:
        """Keep a tree's accepted path: positions start+offsets of the slot, packed from start."""
        self.cache.keep(slot, start, offsets)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)

    def memory_bytes(self) -> int:
        """Bytes of the batch cache (the weights are the single runner's)."""
        return tensor_bytes([*self.cache.keys, *self.cache.values])
