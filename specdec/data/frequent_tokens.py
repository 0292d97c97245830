"""Which tokens a draft model's cut head keeps (models/subset_head.py): the tokenizer's added
and special tokens (chat and fill-in-the-middle markers, end of text), then the tokens most
frequent in a corpus (the running Python's standard library: code, docstrings and comments),
then the rest by id (a byte-level BPE numbers its merges about in order of frequency). Counted
once per tokenizer and kept beside the assembled models (bundled.models_cache_dir)."""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import torch

from specdec.data.corpus import read_text, split_files, stdlib_root
from specdec.models.bundled import models_cache_dir

CORPUS_EVERY = 3  # every third training file: ~10 s of tokenizing, counts stable to a few tokens in 32k


def token_counts(tokenizer, files: list[Path]) -> Counter:
    counts: Counter = Counter()
    texts = [read_text(p) for p in files]
    for i in range(0, len(texts), 64):
        for encoding in tokenizer.encode_batch(texts[i:i + 64], add_special_tokens=False):
            counts.update(encoding.ids)
    return counts


def ranked_tokens(tokenizer, vocab_size: int) -> list[int]:
    """Every id below vocab_size, most worth keeping first (cached per tokenizer)."""
    digest = hashlib.sha256(tokenizer.to_str().encode() + f"|{vocab_size}|{CORPUS_EVERY}".encode()).hexdigest()[:16]
    path = models_cache_dir() / f"draft-vocab-{digest}.json"
    if path.exists():
        return json.loads(path.read_text())
    train, _ = split_files(stdlib_root())
    counts = token_counts(tokenizer, train[::CORPUS_EVERY])
    added = sorted(i for i in tokenizer.get_added_tokens_decoder() if i < vocab_size)
    special = set(added)
    rest = sorted((i for i in range(vocab_size) if i not in special), key=lambda i: (-counts.get(i, 0), i))
    ranked = added + rest
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ranked))
    tmp.replace(path)
    return ranked


def frequent_tokens(tokenizer, vocab_size: int, count: int) -> torch.Tensor:
    """The `count` ids a cut draft head keeps."""
    return torch.tensor(ranked_tokens(tokenizer, vocab_size)[:count], dtype=torch.long)
