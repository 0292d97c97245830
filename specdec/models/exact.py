"""Batch-invariant kernels for exact mode: every row of a pass gets, bit for bit, the output a
1-token pass gives it, so greedy speculative decoding equals plain decoding in any dtype.

Two things make a row's result depend on the pass around it on this CPU (measured, see
tests/test_models.py): attention kernels block their reduction by the number of keys, so a
row scored inside a wider pass (extra keys masked) rounds differently; and matrix
multiplications choose their blocking of the reduction dimension from the number of rows once
it is large (bfloat16: reductions longer than 1024 change with the row count; float32: passes
under 16 rows take other kernels than wider ones). So in exact mode each row attends as
exact_attend_row defines it, alone or beside other rows and sequences (attend_counted), or
among a draft tree's rows (attend_tree; attend_rows picks), and every projection runs through
a plan checked at first use for its weight shape (row_invariant_plan): the reduction split
into chunks the kernels treat alike for every row count, partial products summed in float32
in a fixed order, and passes narrower than a minimum padded."""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from functools import cached_property, lru_cache, partial

import torch
import torch.nn.functional as F

from specdec.models import row_attention
from specdec.models.packed import PackedWeight

# pass widths decoding uses: plain steps, chains of up to 8 drafts, trees of up to 64 nodes
PROBE_ROWS = (2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 33, 48, 65)
_plans: dict[tuple, tuple[int, int]] = {}  # by shape, dtype, device and threads
_weight_plans: dict[tuple, tuple[int, int]] = {}  # by weight and threads: one dict lookup per call


def attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query row per sequence, q [B, nh, 1, hd], over all of k, v [B, nkv, L, hd] (grouped
    query heads: head h reads kv head h // (nh / nkv)), in at least float32: plain decoding's
    attention with the fast kernels (exact mode's is exact_attend_row). Measured here (9 heads
    over 3 kv heads, 2 threads): SDPA's fused CPU kernel on bfloat16 inputs takes 90 us at L =
    200 and 430 us at L = 1000 for a single query, on float32 inputs 13 us and 47 us;
    converting the bf16 cache and calling it in float32 takes 24 us and 73 us, against 35 us
    and 80 us for matmul-softmax-matmul in float32, with the same error against a float64
    reference (scores rounded to bf16 instead would be 8x less accurate). On bf16 caches the
    same arithmetic runs in row_attention's kernel, which reads the cache without a copy."""
    if row_attention.supports(q, k):
        return row_attention.attend_row_bf16(q, k, v)
    return row_attention.reference_attend_row(q, k, v)


KEY_BLOCK = 16  # exact mode zero-pads keys to a multiple of this: see key_length


def key_length(n: int) -> int:
    """The number of key positions exact mode attends over for n keys (padded with zeros and
    masked): see exact_attend_row."""
    return -(-n // KEY_BLOCK) * KEY_BLOCK


_scratch = threading.local()  # per thread: the float32 buffers padded_keys reuses, by name


def padded_keys(t: torch.Tensor, length: int, buffer: str) -> torch.Tensor:
    """t [B, nkv, L, hd] in at least float32 with exactly `length` key positions: cut, or
    padded with zeros (padded keys are masked, but their values must be finite). Written into
    this thread's buffer of that name, valid until the next call with the name. Why: measured
    here, allocating the converted keys and values anew in every layer (8 MB each for 16
    sequences of 650 keys) made the allocator give the memory back and fault it in again,
    ~4,000 page faults a layer and a 16-sequence step 4x slower."""
    dtype = torch.promote_types(t.dtype, torch.float32)
    shape = (t.shape[0], t.shape[1], length, t.shape[3])
    numel = shape[0] * shape[1] * length * shape[3]
    store = _scratch.__dict__.get(buffer)
    if store is None or store.numel() < numel or store.dtype != dtype or store.device != t.device:
        with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode
            store = _scratch.__dict__[buffer] = torch.empty(numel + numel // 2, dtype=dtype, device=t.device)
    out = store[:numel].view(shape)
    kept = min(length, t.shape[2])
    out[:, :, :kept] = t[:, :, :kept]
    out[:, :, kept:] = 0
    return out


Counts = tuple[tuple[int, ...], ...]  # counts[b][t]: row t of sequence b sees keys [0, counts[b][t])


MIN_ROWS = 4  # exact mode's attention matmuls take at least this many query rows: see _attend_padded


@lru_cache(maxsize=8)
def _hiding(counts: Counts | int, nkv: int, G: int, P: int, device: torch.device) -> torch.Tensor:
    """The scores' bias, 0 for the keys a row sees and -inf after: [B * nkv, max(T * G,
    MIN_ROWS), P] for counts per row (padding rows see every key), [P] for one count. Built
    once per pass, shared by its layers."""
    if isinstance(counts, int):
        bias = torch.zeros(P, device=device)
        bias[counts:] = float("-inf")
        return bias
    B, T = len(counts), len(counts[0])
    hidden = torch.arange(P, device=device) >= torch.tensor(counts, device=device).view(B, 1, T, 1, 1)
    bias = torch.zeros(hidden.shape, device=device).masked_fill_(hidden, float("-inf"))
    bias = bias.expand(B, nkv, T, G, P).reshape(B * nkv, T * G, P)
    if T * G < MIN_ROWS:
        bias = torch.cat([bias, bias.new_zeros(B * nkv, MIN_ROWS - T * G, P)], 1)
    return bias


def _attend_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: Counts | int,
                   spans: tuple[tuple[int, int], ...] | None = None) -> torch.Tensor:
    """Rows q [B, nh, T, hd] over k, v [B, nkv, P, hd] (float32, P a multiple of KEY_BLOCK),
    row t of sequence b seeing keys [0, counts[b][t]) (an int: every row that many); spans[t]:
    the range of sequences whose row t is wanted (the others are left zero; default: all).

    Why this form (measured here): a float32 matmul's row gets the same bits whatever the
    other rows hold, and for every row count from MIN_ROWS up (4 to 1,200 checked), but other
    bits under it. For the scores, a reduction over the head size, that is all: every query
    row that shares a kv head (its nh / nkv heads at each of the T positions) goes into one
    matmul over that head's keys, which are read once, with fewer rows padded up to MIN_ROWS;
    they are scaled and masked inside it (baddbmm: fewer passes over them). The weighted sum
    reduces over the keys, and with 4 rows or more its kernels round differently when zeros
    are appended to a key count in 208..368; with the nh / nkv rows of one position (3 for
    SmolLM2) they do not, so it runs per position."""
    B, nh, T, hd = q.shape
    nkv, P = k.shape[1], k.shape[2]
    G, n = nh // nkv, B * nkv
    if T == 1:  # plain decoding's path (~30 layers a token): fewer view ops
        rows = q.reshape(n, G, hd).to(k.dtype)
    else:
        rows = q.reshape(B, nkv, G, T, hd).transpose(2, 3).reshape(n, T * G, hd).to(k.dtype)
    if T * G < MIN_ROWS:
        rows = F.pad(rows, (0, 0, 0, MIN_ROWS - T * G))
    bias = _hiding(counts, nkv, G, P, k.device).to(k.dtype)
    k, v = k.reshape(n, P, hd), v.reshape(n, P, hd)  # views: the keys are not copied
    probs = torch.baddbmm(bias, rows, k.transpose(1, 2), alpha=hd ** -0.5).softmax(-1)  # [n, rows, P]
    if T == 1:
        return torch.bmm(probs[:, :G], v).view(B, nh, 1, hd).to(q.dtype)
    if spans is None:
        out = probs.new_empty(T, n, G, hd)
        for t in range(T):
            torch.bmm(probs[:, t * G:(t + 1) * G], v, out=out[t])
    else:
        out = probs.new_zeros(T, n, G, hd)
        for t, (lo, hi) in enumerate(spans):
            lo, hi = lo * nkv, hi * nkv
            torch.bmm(probs[lo:hi, t * G:(t + 1) * G], v[lo:hi], out=out[t, lo:hi])
    return out.view(T, B, nkv, G, hd).permute(1, 2, 3, 0, 4).reshape(B, nh, T, hd).to(q.dtype)


def exact_attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """attend_row's job in exact mode: the definition every exact row reproduces bit for bit,
    alone or inside a batch of sequences with other key counts (models/batch.py).

    Why this form: no fused kernel here gives a row the same bits inside such a batch (SDPA
    blocks its reduction by the key count; matmuls choose kernels by the number of rows, and
    by key counts that are not a multiple of 16: measured). So the keys are zero-padded to a
    multiple of KEY_BLOCK and masked, the rows go into matmuls whose row counts keep them in
    one kernel class (_attend_padded), and softmax and the weighted sum see only exact zeros
    where a batch adds keys; attend_counted checks at first use that this holds here. Cost
    here (9 heads over 3 kv heads, bf16 cache of 300 keys, 2 threads, one process): ~54 us,
    the previous form's (3 rows, no padding row) 47; for 4 sequences x 4 rows over ~450 keys
    attend_counted takes 291 us, the previous form's call per row index 446."""
    L = k.shape[2]
    P = key_length(L)
    return _attend_padded(q, padded_keys(k, P, "keys"), padded_keys(v, P, "values"), L)


_batch_ok: dict[tuple, bool] = {}  # by heads, head size, dtype and threads


def _rows_batch_alike(nh: int, nkv: int, hd: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether attend_counted may attend all sequences' rows together (keys padded to the
    longest) and still give each row exact_attend_row's bits over its own keys, here: the
    matmul kernels' choices depend on shapes (measured here: 9 heads over 3 kv heads of 64 and
    4 over 4 of 32 pass; 5 over 1 of 64 and 8 over 2 of 32 fail), so it is checked once per
    shape, dtype and thread count."""
    dtype = torch.promote_types(dtype, torch.float32)  # the matmuls' dtype; full-precision inputs check harder
    key = (nh, nkv, hd, dtype, device.type, torch.get_num_threads())
    if key not in _batch_ok:
        g = torch.Generator(device=device).manual_seed(0)
        ok = True
        for counts in ([[1], [17], [300], [45], [1000], [16], [64]], [[513, 514, 515], [200, 201, 202], [7, 8, 9]],
                       [[30 + t for t in range(9)]], [[33], [32]], [[90, 91], [400], [12, 13, 14], [5]]):
            B, T, L = len(counts), max(map(len, counts)), max(map(max, counts))
            q, k, v = (torch.randn(B, heads, length, hd, generator=g, device=device, dtype=dtype)
                       for heads, length in ((nh, T), (nkv, L), (nkv, L)))
            P = key_length(L)
            together = _attend_together(q, padded_keys(k, P, "keys"), padded_keys(v, P, "values"),
                                        tuple(map(tuple, counts)))
            for b, row in enumerate(counts):
                for t, c in enumerate(row):
                    alone = exact_attend_row(q[b:b + 1, :, t:t + 1], k[b:b + 1, :, :c], v[b:b + 1, :, :c])
                    ok = ok and torch.equal(together[b, :, t:t + 1], alone[0])
        _batch_ok[key] = ok
    return _batch_ok[key]


@lru_cache(maxsize=8)
def _ragged(counts: Counts, T: int) -> tuple[Counts, tuple[tuple[int, int], ...]]:
    """counts padded to T rows per sequence (a padding row sees its sequence's last row's keys),
    and per position the range of sequences that have it. Once per pass, shared by its layers."""
    full = tuple(tuple(row) + (row[-1] if row else 1,) * (T - len(row)) for row in counts)
    spans = []
    for t in range(T):
        live = [b for b, row in enumerate(counts) if len(row) > t]
        spans.append((live[0], live[-1] + 1) if live else (0, 0))
    return full, tuple(spans)


def _attend_together(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, counts: Counts) -> torch.Tensor:
    """attend_counted over keys kp, vp already padded (padded_keys) to the longest: every
    sequence's rows in one call, each sequence's keys read once (a view, never a copy).
    A sequence with fewer rows than the widest gets padding rows that see its last row's keys;
    they are left zero, and each position's weighted sum runs only over the range of sequences
    that have that position (from the first to the last of them)."""
    T = q.shape[2]
    if all(len(row) == T for row in counts):
        return _attend_padded(q, kp, vp, counts)
    full, spans = _ragged(counts, T)
    out = _attend_padded(q, kp, vp, full, spans)
    for b, row in enumerate(counts):
        out[b, :, len(row):] = 0
    return out


ROW_BUDGET = 1 << 22  # scores held at once by attend_counted, in elements (16 MiB of float32)


def attend_counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: Counts) -> torch.Tensor:
    """Rows q [B, nh, T, hd] over k, v [B, nkv, L, hd] (any dtype), row t of sequence b seeing
    the first counts[b][t] keys: each row gets the bits of exact_attend_row over exactly its
    keys (rows t >= len(counts[b]) are padding: left zero). The sequences attend together
    (_attend_together, as many rows at a time as ROW_BUDGET allows) where that is checked to
    give the same bits here (_rows_batch_alike), else one call per row with exact_attend_row's
    own shapes."""
    B, nh, T, hd = q.shape
    P = key_length(max(c for row in counts for c in row))
    together = _rows_batch_alike(nh, k.shape[1], hd, q.dtype, q.device)  # first: its check uses the buffers
    kp, vp = padded_keys(k, P, "keys"), padded_keys(v, P, "values")  # converted once for every row and chunk
    if together:
        step = max(1, ROW_BUDGET // (B * nh * P))
        if T <= step:
            return _attend_together(q, kp, vp, counts)
        return torch.cat([_attend_together(q[:, :, t:t + step], kp, vp, tuple(r[t:t + step] for r in counts))
                          for t in range(0, T, step)], 2)
    out = torch.zeros_like(q)  # one call per row over its own padded keys (a view: keys past its count get p = 0)
    for b in range(B):
        for t, c in enumerate(counts[b]):
            own = key_length(c)
            own_k, own_v = kp[b:b + 1, :, :own], vp[b:b + 1, :, :own]
            out[b:b + 1, :, t:t + 1] = _attend_padded(q[b:b + 1, :, t:t + 1], own_k, own_v, c)
    return out


@dataclass(frozen=True, eq=False)  # hashed by identity: one per pass, a cache key for its layout
class TreeRows:
    """A tree pass's new rows: row i sees the cache's first `past` keys and the new rows
    seen[i] (bool [T, T]: itself and its ancestors)."""
    past: int
    seen: torch.Tensor

    @cached_property
    def positions(self) -> list[torch.Tensor]:
        """Per row, the cache positions it attends to, in cache order (once per pass: the
        layers that fall back to gathering share them)."""
        prefix = torch.arange(self.past, device=self.seen.device)
        return [torch.cat([prefix, self.past + row.nonzero()[:, 0]]) for row in self.seen]


@lru_cache(maxsize=4)
def _tree_layout(tree: TreeRows, G: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query row (the G rows of each node alike, padding rows to MIN_ROWS as row 0), over
    the pass's keys [cache + new rows, padded to key_length]: bias [R, P], 0 for the keys the
    row sees and -inf for the others; order [R, P - past], the keys past the prefix that it
    sees first, in cache order (as its own 1-token pass has them), then the others; back,
    order's inverse. Built once per pass, shared by its layers."""
    seen = tree.seen
    T, device = seen.shape[0], seen.device
    P = key_length(tree.past + T)
    visible = torch.ones(T, P, dtype=torch.bool, device=device)
    visible[:, tree.past:tree.past + T] = seen
    visible[:, tree.past + T:] = False
    order = (torch.arange(P, device=device) + (~visible) * P).argsort(1)  # a stable order within each group
    bias = torch.zeros(T, P, device=device).masked_fill_(~visible, float("-inf"))
    rows = torch.arange(T, device=device).repeat_interleave(G)
    if T * G < MIN_ROWS:
        rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - T * G)])
    tail = order[:, tree.past:] - tree.past  # every row sees the prefix: only the rest moves
    return bias[rows], tail[rows], tail.argsort(1)[rows]


def attend_tree(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree: TreeRows) -> torch.Tensor:
    """Tree rows q [B, nh, T, hd] over the cache k, v [B, nkv, past + T, hd], each row seeing
    the keys tree says, with exact_attend_row's bits over exactly those keys in cache order:
    the keys are read once for all rows instead of gathered per row.

    Why this form (measured here, float32 products): a score is the same bits wherever its
    key lies among the keys (and for every row count from MIN_ROWS up), so all rows are scored
    against all keys in one matmul, the keys a row does not see masked inside it; softmax is
    not (its sum is blocked by position), so each row's scores are put in its own keys' order
    (the hidden ones after them, as padding: only keys past the prefix move), softmaxed there,
    and put back; the weighted sum of one node's nh / nkv rows (3 for SmolLM2) gets the same
    bits when zero weights sit between its keys, so it runs per node over all the values (one
    batched call per kv head, the values shared, not copied). _tree_alike checks at first use
    that this holds for the shapes at hand."""
    B, nh, T, hd = q.shape
    nkv = k.shape[1]
    G, n = nh // nkv, B * nkv
    bias, order, back = _tree_layout(tree, G)
    P = bias.shape[1]
    kp, vp = padded_keys(k, P, "keys"), padded_keys(v, P, "values")
    kp, vp = kp.reshape(n, P, hd), vp.reshape(n, P, hd)
    rows = q.reshape(B, nkv, G, T, hd).transpose(2, 3).reshape(n, T * G, hd).to(kp.dtype)
    if T * G < MIN_ROWS:
        rows = F.pad(rows, (0, 0, 0, MIN_ROWS - T * G))
    scores = torch.baddbmm(bias.to(kp.dtype), rows, kp.transpose(1, 2), alpha=hd ** -0.5)
    past = P - order.shape[1]
    scores[:, :, past:] = scores[:, :, past:].gather(2, order.expand(n, -1, -1))  # each row's own order
    probs = scores.softmax(-1)
    probs[:, :, past:] = probs[:, :, past:].gather(2, back.expand(n, -1, -1))  # back in cache order
    probs = probs[:, :T * G].view(n, T, G, P)
    out = torch.stack([torch.bmm(probs[i], vp[i].expand(T, P, hd)) for i in range(n)])  # [n, T, G, hd]
    return out.view(B, nkv, T, G, hd).transpose(2, 3).reshape(B, nh, T, hd).to(q.dtype)


_tree_ok: dict[tuple, bool] = {}  # by heads, head size, dtype and threads


def _tree_alike(nh: int, nkv: int, hd: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether attend_tree gives every row exact_attend_row's bits here for these shapes
    (checked once per shape, dtype and thread count on random trees and prefix lengths)."""
    dtype = torch.promote_types(dtype, torch.float32)
    key = (nh, nkv, hd, dtype, device.type, torch.get_num_threads())
    if key not in _tree_ok:
        g = torch.Generator(device=device).manual_seed(0)
        ok = True
        for past, T in ((5, 3), (200, 11), (331, 13), (1000, 17), (17, 5), (64, 33)):
            # any rows seeing any earlier ones (trees are a case of it), each itself
            seen = (torch.rand(T, T, generator=g, device=device) < 0.5).tril() | torch.eye(T, dtype=torch.bool,
                                                                                         device=device)
            q = torch.randn(1, nh, T, hd, generator=g, device=device, dtype=dtype)
            k, v = (torch.randn(1, nkv, past + T, hd, generator=g, device=device, dtype=dtype) for _ in range(2))
            tree = TreeRows(past, seen)
            together = attend_tree(q, k, v, tree)
            for i, keys in enumerate(tree.positions):
                alone = exact_attend_row(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys])
                ok = ok and torch.equal(together[:, :, i:i + 1], alone)
        _tree_ok[key] = ok
    return _tree_ok[key]


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                row_keys: list[int | torch.Tensor] | TreeRows) -> torch.Tensor:
    """Exact mode's attention for the new rows q [B, nh, T, hd] over k, v: each row alone over
    exactly the keys it may see, in cache order, with exact_attend_row's bits (plain decoding's
    1-token pass at that position in exact mode). row_keys: a tree pass's TreeRows, or per
    row n = the first n cache positions, or the positions."""
    B, nh, T, hd = q.shape
    nkv = k.shape[1]
    if isinstance(row_keys, TreeRows):
        if _tree_alike(nh, nkv, hd, q.dtype, q.device):  # first: its check uses the buffers
            return attend_tree(q, k, v, row_keys)
        row_keys = row_keys.positions
    counted = [i for i, keys in enumerate(row_keys) if isinstance(keys, int)]
    if len(counted) == T:  # a chain
        return attend_counted(q, k, v, (tuple(row_keys),) * B)
    out = torch.empty_like(q)
    if counted:
        out[:, :, counted] = attend_counted(q[:, :, counted], k, v, (tuple(row_keys[i] for i in counted),) * B)
    flat_k, flat_v = k.flatten(0, 1), v.flatten(0, 1)
    for i, keys in enumerate(row_keys):
        if not isinstance(keys, int):  # index_select over [B*nkv, L, hd]: ~8x faster here than on the 4-d tensor
            k_row, v_row = (t.index_select(1, keys).view(B, nkv, -1, hd) for t in (flat_k, flat_v))
            out[:, :, i:i + 1] = exact_attend_row(q[:, :, i:i + 1], k_row, v_row)
    return out


def exact_row_keys(T: int, past: int, attn_mask: torch.Tensor | None) -> list[int] | TreeRows:
    """The keys each new row attends to (see attend_rows): a chain's key counts, or a tree's rows."""
    if attn_mask is None:
        return [past + i + 1 for i in range(T)]
    return TreeRows(past, attn_mask.to(torch.bool))


def _planned_linear(x: torch.Tensor, weight: torch.Tensor, k_chunk: int, min_rows: int,
                    packed: PackedWeight | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T under a plan (see row_invariant_plan); packed: the same products, faster."""
    m = x.shape[0]
    if m < min_rows:
        x = torch.cat([x, x[:1].expand(min_rows - m, -1)])
    if k_chunk >= x.shape[1]:
        y = packed(x) if packed is not None else F.linear(x, weight)
    else:
        chunks = packed.chunks(k_chunk) if packed is not None else None
        products = chunks or [partial(F.linear, weight=wc) for wc in weight.split(k_chunk, 1)]
        parts = [product(xc).float() for xc, product in zip(x.split(k_chunk, 1), products)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part  # fixed order: the same sum for every row
        y = total.to(x.dtype)
    return y[:m]


def _row_invariant(weight: torch.Tensor, k_chunk: int, min_rows: int, packed: PackedWeight | None) -> bool:
    g = torch.Generator(device=weight.device).manual_seed(0)
    for m in PROBE_ROWS:
        x = torch.randn(m, weight.shape[1], generator=g, device=weight.device).to(weight.dtype)
        full = _planned_linear(x, weight, k_chunk, min_rows, packed)
        for r in {0, m // 2, m - 1}:
            if not torch.equal(_planned_linear(x[r:r + 1], weight, k_chunk, min_rows, packed)[0], full[r]):
                return False
    return True


@torch.inference_mode()
def row_invariant_plan(weight: torch.Tensor, packed: PackedWeight | None = None) -> tuple[int, int]:
    """(reduction chunk, minimum rows) under which this weight's products are row-invariant
    here: the first candidate, cheapest first, that passes a check over the pass widths
    decoding uses (the failures are systematic, from kernel blocking, so random inputs reveal
    them). Cached by shape, dtype, thread count and kernel (F.linear or the packed weight's),
    which is what the kernels choose by."""
    n, k = weight.shape
    key = (n, k, weight.dtype, weight.device.type, torch.get_num_threads(), packed is not None)
    if key not in _plans:
        # cheapest first, measured here (SmolLM2's bf16 down projection, weights streamed from
        # memory): padding a 1-row pass to 4 or 8 rows costs less than splitting the reduction
        # (two products and a float32 sum: 168 us a call against 94 at 4 rows)
        chunks = [c for c in (1024, 768, 512) if c < k]
        candidates = ([(k, rows) for rows in (1, 4, 8)] + [(c, rows) for rows in (1, 4, 8) for c in chunks]
                      + [(c, 16) for c in [k] + chunks])
        plan = next((c for c in candidates if _row_invariant(weight, *c, packed)), None)
        if plan is None:
            warnings.warn(f"exact mode: no row-invariant plan found for a {n}x{k} {weight.dtype} matmul on "
                          "this machine; greedy output may differ from plain decoding", stacklevel=2)
            plan = (k, 1)
        _plans[key] = plan
    return _plans[key]


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 packed: PackedWeight | None = None) -> torch.Tensor:
    """F.linear whose every row is computed alike whatever the number of rows (packed: the
    weight packed for oneDNN, see packed.py; its plan is checked on its own kernel)."""
    # kernels choose by threads too
    key = (weight.data_ptr(), weight.shape, weight.dtype, torch.get_num_threads(), packed is not None)
    plan = _weight_plans.get(key)
    if plan is None:
        plan = _weight_plans[key] = row_invariant_plan(weight, packed)
    k_chunk, min_rows = plan
    if k_chunk >= weight.shape[1] and min_rows == 1:  # the kernels are row-invariant as they are
        return packed(x, bias) if packed is not None else F.linear(x, weight, bias)
    y = _planned_linear(x.reshape(-1, x.shape[-1]), weight, k_chunk, min_rows, packed)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y + bias if bias is not None else y
