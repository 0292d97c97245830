"""A GGUF's tokenizer, rebuilt by transformers' GGUF tokenizer conversion, plus the one
pre-tokenizer family it does not restore (digits split one by one before the GPT-2 split:
SmolLM2, StarCoder), so ids match the original tokenizer.json. Built once per vocabulary in a
process: a draft model of the target's family (Qwen2.5-Coder's 0.5B) shares the target's
tokenizer rather than a second copy (~1.4 s and ~50 MB for 152k tokens). A slow build is
remembered as tokenizer.json under the cache (gguf-tokenizers/), keyed by the vocabulary and the
versions that built it, and read back by `tokenizers` alone: ~2 s of each Qwen load, and no
transformers import."""
from __future__ import annotations

import hashlib
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.models.gguf import GGUFFile
from specdec.models.gguf_header import headers_dir, write_cached

TOKENIZER_FORMAT = 1  # bump when what _build makes changes
REMEMBER_AFTER_SECONDS = 1.0

# llama.cpp pre-tokenizers that split every digit off before the GPT-2 regex (llama-vocab.cpp).
DIGITS_FIRST_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_BUILT: dict[str, Any] = {}  # digest of the tokenizer.ggml.* fields -> tokenizers.Tokenizer
_KEEP = 2


def build_tokenizer(g: GGUFFile):
    """(tokenizers.Tokenizer, tokenizer_config dict) rebuilt from the GGUF's vocabulary (the
    Tokenizer shared by files with the same `tokenizer.ggml.*` fields, whatever their chat
    templates: the Qwen2.5-Coder pair's differ only there; the dict built for this file)."""
    vocabulary = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.ggml.")}
    digest = hashlib.sha256(json.dumps([g.architecture, vocabulary], sort_keys=True).encode()).hexdigest()
    if digest not in _BUILT:
        while len(_BUILT) >= _KEEP:
            _BUILT.pop(next(iter(_BUILT)))
        remembered = _remembered(digest)
        _BUILT[digest] = remembered if remembered is not None else _build_and_remember(g, digest)
    return _BUILT[digest], _config(g)


def tokenizers_dir() -> Path:
    """$XDG_CACHE_HOME/specdec/gguf-tokenizers (default ~/.cache/...)."""
    return headers_dir().parent / "gguf-tokenizers"


def _remembered_file(digest: str) -> Path:
    versions = [TOKENIZER_FORMAT] + [_version(p) for p in ("transformers", "tokenizers")]
    key = hashlib.sha256(json.dumps([digest, versions]).encode()).hexdigest()[:32]
    return tokenizers_dir() / f"{key}.json"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def _remembered(digest: str):
    from tokenizers import Tokenizer

    file = _remembered_file(digest)
    if not file.is_file():
        return None
    try:
        return Tokenizer.from_file(str(file))
    except Exception:  # a parse boundary: a damaged file is rebuilt and written again
        return None


def _build_and_remember(g: GGUFFile, digest: str):
    start = time.perf_counter()
    tok = _build(g)
    if time.perf_counter() - start > REMEMBER_AFTER_SECONDS:
        write_cached(_remembered_file(digest), tok.to_str())
    return tok


def _spec(g: GGUFFile) -> dict[str, Any]:
    """transformers' names for the GGUF's tokenizer fields."""
    renames = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens",
               "scores": "scores", "token_type": "token_type", "merges": "merges",
               "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
               "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id",
               "add_space_prefix": "add_prefix_space", "precompiled_charsmap": "precompiled_charsmap"}
    return {new: g.metadata[f"tokenizer.ggml.{old}"] for old, new in renames.items()
            if f"tokenizer.ggml.{old}" in g.metadata}


def _build(g: GGUFFile):
    from tokenizers import pre_tokenizers

    tokens = g.metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise SpecdecError(f"GGUF {str(g.path)!r} has no tokenizer (tokenizer.ggml.tokens is missing)")
    spec = _spec(g)
    kind, pre = spec.get("tokenizer_type"), spec.get("pre_tokenizer_type")
    convert, known_splits = _transformers_converter()
    if kind == "gpt2" and pre not in ("gpt-2", "default", None, *DIGITS_FIRST_PRE, *known_splits):
        raise SpecdecError(f"GGUF {str(g.path)!r} uses llama.cpp pre-tokenizer {pre!r}, which specdec "
                           "cannot reproduce exactly; load the model's Hugging Face folder instead")
    try:
        tok, _ = convert(g.architecture, spec)
    except Exception as e:  # transformers raises ValueError/KeyError/NotImplementedError here
        raise SpecdecError(f"cannot rebuild the tokenizer of GGUF {str(g.path)!r} "
                           f"(tokenizer {kind!r}): {type(e).__name__}: {e}") from None
    if kind == "gpt2" and pre in DIGITS_FIRST_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


def _config(g: GGUFFile) -> dict[str, Any]:
    """tokenizer_config-style settings: special tokens' text, BOS/EOS flags, chat template."""
    meta, spec = g.metadata, _spec(g)
    tokens = meta.get("tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for name in ("bos", "eos", "unk", "pad"):
        i = spec.get(f"{name}_token_id")
        if i is not None and 0 <= i < len(tokens):
            config[f"{name}_token"] = tokens[i]
    for key in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{key}" in meta:
            config[key] = bool(meta[f"tokenizer.ggml.{key}"])
    if isinstance(meta.get("tokenizer.chat_template"), str):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def _transformers_converter():
    """transformers' GGUF tokenizer conversion and the pre-tokenizer splits it knows."""
    from specdec.extras import require

    module = require("transformers.integrations.gguf.gguf_tokenizer_mapping", "gguf",
                     "rebuilding a GGUF's tokenizer")
    if not hasattr(module, "convert_gguf_tokenizer"):
        raise SpecdecError("rebuilding a GGUF's tokenizer needs a transformers with "
                           "transformers.integrations.gguf (tested with 5.24): pip install -U transformers")
    return module.convert_gguf_tokenizer, tuple(getattr(module, "GGUF_PRE_TOKENIZER_SPLITS", {}))


