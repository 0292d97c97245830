"""A model plus its KV cache behind the small interface the decode loop needs (`Runner`). The
native runner supports tree masks and hidden states; the transformers runner (hf_backend.py)
supports chain decoding for any causal LM."""
from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Protocol

import torch

from specdec.models.cache import KVCache
from specdec.models.compiled import SMALL_MODEL_BYTES
from specdec.models.llama import LlamaModel
from specdec.models.packed import packed_bytes
from specdec.models.stack import dense_stack, time_fast_paths


class Runner(Protocol):
    supports_tree: bool  # accepts attn_mask/positions in extend() and keep()
    vocab_size: int
    max_len: int  # context window of the cache
    last_hidden: torch.Tensor | None  # final hidden states of the last extend(want_hidden=True)
    # exact passes cost no more than fast ones, so an exact sequence's prompt is prefilled exactly
    # too: its rows then never depend on which kernels a timing at load chose for wide passes
    exact_is_free: bool

    @property
    def length(self) -> int:
        """Tokens held in the cache."""

    def reset(self) -> None: ...

    def extend(self, ids: list[int], attn_mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, want_hidden: bool = False,
               exact: bool = False, want_logits: bool = True, last_logits: bool = False) -> torch.Tensor | None:
        """Append ids to the cache; return their logits [T, V]. exact: each row's logits do not
        depend on how many rows the pass holds (runners that cannot promise it ignore it).
        want_logits=False: a prefill that needs only the cache; runners may then skip the LM
        head and return None. last_logits: only the last row's are needed; runners may then
        return [1, V]."""

    def rollback(self, length: int) -> None: ...

    def keep(self, start: int, offsets: list[int]) -> None:
        """Keep only positions start+offsets among those written after start (tree runners)."""

    def memory_bytes(self) -> int:
        """Bytes of weights and cache."""


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct storages (tied weights counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


# The cache is allocated whole up front: Qwen2.5-Coder-1.5B's 32k window would hold 940 MB of
# it; llama.cpp's default context is 4096. A longer window is asked for with max_len.
DEFAULT_CONTEXT = 8192


class NativeRunner:
    supports_tree = True

    def __init__(self, model: LlamaModel, max_len: int | None = None, fuse: bool = True, pack: bool = True,
                 compile: bool = False):
        """fuse: Q/K/V and gate/up as one matmul each; pack: weights packed for oneDNN once
        (models/packed.py: bfloat16 outputs keep their bits, float32 ones change by rounding);
        compile: fast passes run through inductor, embedding to logits (models/compiled.py),
        which freezes and packs a copy of the weights itself; the eager passes it leaves
        (prefill chunks, exact passes) use the packed weights if pack, and the LM head is packed
        either way. All are for inference only."""
        self.model = model.fuse_projections() if fuse else model
        if pack:
            self.model.pack_weights()
        if compile:
            self.model.compile_forward(cpp_wrapper=tensor_bytes(self.model.parameters()) < SMALL_MODEL_BYTES)
            if not pack:  # pack_weights() packed it already
                self.model.pack_lm_head()
        if self.model.stack is None and self.model.compiled is None:  # dense weights: their layers in one call too
            self.model.stack = dense_stack(self.model)
            if self.model.stack is not None:
                self.model.fast_paths = time_fast_paths(self.model)
        self.vocab_size = model.config.vocab_size
        self.max_len = min(max_len or DEFAULT_CONTEXT, model.config.max_position_embeddings)
        self.cache: KVCache = model.new_cache(self.max_len)
        self.last_hidden: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def exact_is_free(self) -> bool:
        return self.model.exact_is_free

    def reset(self) -> None:
        self.cache.rollback(0)

    def fork(self) -> NativeRunner:
        """A runner for another sequence: the same model (weights, packed kernels), its own KV cache."""
        other = copy.copy(self)
        other.cache, other.last_hidden = self.model.new_cache(self.max_len), None
        return other

    @torch.inference_mode()
    def extend(self, ids: list[int], attn_mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, want_hidden: bool = False,
               exact: bool = False, want_logits: bool = True, last_logits: bool = False) -> torch.Tensor | None:
        """Append ids to the cache; return their logits [T, V] (hidden states in last_hidden);
        None when not want_logits and the pass ran eagerly (the LM head skipped); [1, V] with
        last_logits on the eager path (the head over the last row only)."""
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        if positions is not None:
            positions = positions.to(self.model.device)
        logits, hidden = self.model(x, positions, self.cache, attn_mask, return_hidden=True, exact=exact,
                                    want_logits=want_logits, last_logits=last_logits)
        self.last_hidden = hidden[0] if want_hidden else None
        return None if logits is None else logits[0]

    def rollback(self, length: int) -> None:
        self.cache.rollback(length)

    @property
    def kv_rows_invariant(self) -> bool:
        """Whether every key/value row written has the same bits however many rows its pass
        held: true where every pass runs on the one-call stack (models/stack.py), so a cached
        prefix is what a fresh prefill would write."""
        fast = self.model.fast_paths
        return self.model.stack is not None and self.model.compiled is None and (fast is None or fast.stack_only)

    def keep(self, start: int, offsets: list[int]) -> None:
        self.cache.keep(start, offsets)

    def memory_bytes(self) -> int:
        return (tensor_bytes([*self.model.parameters(), *self.model.buffers(), *self.cache.keys, *self.cache.values])
                + packed_bytes(self.model))
