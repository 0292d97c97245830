"""The engines `specdec bench` measures specdec against, on the same weights and prompt ids:
transformers' generate() (plain, assistant_model=, prompt_lookup_num_tokens=), loading the
same folder or GGUF, and llama.cpp's llama-server (plain and n-gram speculative) on a GGUF
of the target in the bench's dtype. Each runner returns GenerationStats like specdec's."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from specdec.bench.llama_cpp import LlamaServer
from specdec.cli.convert import hf_to_gguf
from specdec.engine.text import TextTokenizer
from specdec.models.checkpoint import open_model, parse_dtype
from specdec.models.runner import tensor_bytes
from specdec.stats import GenerationStats

HF_METHODS = ("hf", "hf-assisted", "hf-lookup")
# bench method name -> llama_cpp.SPEC_ARGS configuration
LLAMA_CPP_METHODS = {"llama.cpp": "none", "llama.cpp-ngram": "ngram", "llama.cpp-ngram-mod": "ngram-mod",
                     "llama.cpp-draft": "draft"}
# bench dtype -> the GGUF weight type llama.cpp computes with
GGUF_OUTTYPES = {"float32": "f32", "float64": "f32", "bfloat16": "bf16", "float16": "f16"}


def load_hf_model(model: str | Path, dtype: str):
    """A transformers model from a Hugging Face folder, or from a GGUF with `gguf_file=`."""
    from specdec.models.gguf import load_transformers_gguf
    from specdec.models.hf_backend import load_transformers

    source = open_model(model)
    if source.is_gguf:
        return load_transformers_gguf(source.path, parse_dtype(dtype))
    return load_transformers(source.path, dtype)


def hf_tokenizer(tokenizer: TextTokenizer):
    """transformers' wrapper around the same tokenizer (UAG decodes and re-encodes with it)."""
    from transformers import PreTrainedTokenizerFast

    config = {k: v for k, v in tokenizer.config.items() if k in ("bos_token", "eos_token") and isinstance(v, str)}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.tok, **config)


class TransformersPeer:
    """transformers generate(): plain, with assistant_model, or with prompt_lookup_num_tokens."""

    def __init__(self, mode: str, target: str | Path, draft: str | Path | None, tokenizer: TextTokenizer,
                 dtype: str = "float32"):
        self.mode = mode
        self.speculative = mode != "hf"
        self.model = load_hf_model(target, dtype)
        self.assistant = load_hf_model(draft, dtype) if mode == "hf-assisted" else None
        self.tokenizer = tokenizer
        # a draft with another vocabulary: Universal Assisted Generation (text re-encoded at
        # T=0; at T > 0 transformers' own token-level intersection), which needs both tokenizers
        self.tokenizers = {}
        if self.assistant is not None and self.assistant.config.vocab_size != self.model.config.vocab_size:
            self.tokenizers = dict(tokenizer=hf_tokenizer(tokenizer),
                                   assistant_tokenizer=hf_tokenizer(TextTokenizer(draft)))

    def memory_mb(self) -> float:
        """Weights only: transformers' dynamic caches are transient."""
        models = [self.model] + ([self.assistant] if self.assistant is not None else [])
        return sum(tensor_bytes([*m.parameters(), *m.buffers()]) for m in models) / 2**20

    def peak_rss_mb(self) -> float | None:
        return None  # shares the bench's process

    @torch.inference_mode()
    def run(self, prompt: str, temperature: float, max_new: int, seed: int) -> GenerationStats:
        ids = torch.tensor([self.tokenizer.encode(prompt)])
        kw = dict(max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=None, pad_token_id=0,
                  attention_mask=torch.ones_like(ids), do_sample=temperature > 0)
        if temperature > 0:
            kw.update(temperature=temperature, top_k=0, top_p=1.0)
        if self.assistant is not None:
            kw.update(assistant_model=self.assistant, **self.tokenizers)
        if self.mode == "hf-lookup":
            kw["prompt_lookup_num_tokens"] = 10
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = self.model.generate(ids, **kw)
        stats = GenerationStats(self.mode)
        stats.wall_seconds = time.perf_counter() - t0
        stats.new_tokens = out.shape[1] - ids.shape[1]
        return stats


def llama_cpp_gguf(target: str | Path, dtype: str, folder: Path) -> Path:
    """The target as a GGUF whose weights are what specdec computes with in `dtype` (a GGUF
    target is dequantized and rewritten: llama.cpp on the shipped Q4_1 file would run other
    arithmetic, which --llama-cpp-gguf can still ask for)."""
    outtype = GGUF_OUTTYPES[str(parse_dtype(dtype)).removeprefix("torch.")]
    source = open_model(target)
    return hf_to_gguf(source, folder / f"{source.path.stem}.{outtype}.gguf", outtype)


class LlamaCppPeer:
    """One llama-server configuration; the prompt goes in as specdec's token ids."""

    def __init__(self, method: str, server: LlamaServer, tokenizer: TextTokenizer):
        self.method = method
        self.speculative = server.spec != "none"
        self.server = server
        self.tokenizer = tokenizer

    def memory_mb(self) -> float | None:
        return None  # llama.cpp's weights live in another process: see peak_rss_mb

    def peak_rss_mb(self) -> float | None:
        peak = self.server.peak_rss_bytes()
        return None if peak is None else peak / 2**20

    def run(self, prompt: str, temperature: float, max_new: int, seed: int) -> GenerationStats:
        done = self.server.complete(self.tokenizer.encode(prompt), max_new, temperature, seed)
        stats = GenerationStats(self.method)
        stats.new_tokens = len(done.tokens)
        stats.wall_seconds = done.seconds
        stats.prefill_seconds = float(done.timings.get("prompt_ms", 0.0)) / 1000  # the server's own timing
        stats.drafted_tokens = done.draft_n
        stats.accepted_tokens = done.draft_n_accepted
        stats.target_forwards = done.target_passes
        return stats
