"""Any Hugging Face causal LM through `transformers`, with the runner interface the decode loop
uses (extend / rollback by cache cropping). Chain decoding only: no tree masks."""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.models.checkpoint import parse_dtype, read_hf_config, safetensors_files


def load_transformers(folder: str | Path, dtype: str | torch.dtype = "float32"):
    AutoModelForCausalLM = require("transformers", "hf", "the transformers backend").AutoModelForCausalLM

    read_hf_config(folder)
    safetensors_files(folder)  # refuses pickle-only folders before transformers sees them
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=parse_dtype(dtype), use_safetensors=True, local_files_only=True)
    except (ValueError, OSError, KeyError) as e:
        raise SpecdecError(f"transformers could not load {str(folder)!r}: {e}") from None
    return model.eval()


class TransformersRunner:
    supports_tree = False
    exact_is_free = False

    def __init__(self, model, max_len: int | None = None):
        from transformers import DynamicCache

        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        ctx = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", 2048)
        self.max_len = min(max_len or ctx, ctx)
        self._cache_cls = DynamicCache
        # transformers renamed `past_key_values` to `cache` (5.x); use whichever forward takes
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.cache = DynamicCache()
        self.length = 0
        self.last_hidden = None

    def reset(self) -> None:
        self.cache = self._cache_cls()
        self.length = 0

    @torch.inference_mode()
    def extend(self, ids: list[int], attn_mask=None, positions=None, want_hidden: bool = False,
               exact: bool = False, want_logits: bool = True, last_logits: bool = False) -> torch.Tensor:
        """exact is not available here: transformers' kernels decide the reduction order (and
        the logits are computed whatever want_logits and last_logits say)."""
        if attn_mask is not None:
            raise SpecdecError("the transformers backend supports chain decoding only (no tree masks)")
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        pos = torch.arange(self.length, self.length + len(ids), device=self.model.device)[None]
        out = self.model(input_ids=x, use_cache=True, position_ids=pos, output_hidden_states=want_hidden,
                         **{self._cache_arg: self.cache})
        self.cache = getattr(out, "cache", None) or out.past_key_values
        self.length += len(ids)
        self.last_hidden = out.hidden_states[-1][0] if want_hidden else None
        return out.logits[0]

    def keep(self, start: int, offsets: list[int]) -> None:
        raise SpecdecError("the transformers backend supports chain decoding only (no draft trees)")

    def memory_bytes(self) -> int:
        """Weights only: the dynamic cache grows with the context."""
        from specdec.models.runner import tensor_bytes

        return tensor_bytes([*self.model.parameters(), *self.model.buffers()])

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count: tokens to remove (any version)
            self.length = length
