"""Measure a target/draft pair: held-out loss, greedy agreement, per-token forward cost."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from specdec.data.corpus import split_files, stdlib_root
from specdec.engine.text import TextTokenizer
from specdec.models.checkpoint import load_native
from specdec.train.recipe import encode_files


def heldout_tokens(model_dir: str | Path) -> np.ndarray:
    tok = TextTokenizer(model_dir).tok
    _, held = split_files(stdlib_root())
    return encode_files(tok, held)


@torch.inference_mode()
def forward_seconds_per_token(model, steps: int = 64, context: int = 128) -> float:
    """Time of one incremental single-token forward (batch 1, with a KV cache)."""
    cache = model.new_cache(context + steps + 1)
    model(torch.zeros(1, context, dtype=torch.long), cache=cache)
    x = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(8):
        model(x, cache=cache)
    cache.rollback(context)
    t0 = time.perf_counter()
    for _ in range(steps):
        model(x, cache=cache)
    return (time.perf_counter() - t0) / steps


@torch.inference_mode()
def evaluate_pair(target_dir: str | Path, draft_dir: str | Path, heldout: str | Path | None = None,
                  windows: int | None = None, seq_len: int = 512) -> dict:
    """windows: how many seq_len windows of the held-out tokens to score (None: all of them)."""
    target = load_native(target_dir, "float32")
    draft = load_native(draft_dir, "float32")
    tokens = np.load(heldout) if heldout else heldout_tokens(target_dir)
    n = (len(tokens) - 1) // seq_len
    if windows is not None:
        n = min(n, windows)
    t_loss = d_loss = agree = count = 0.0
    for i in range(n):
        chunk = torch.from_numpy(tokens[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))[None]
        x, y = chunk[:, :-1], chunk[0, 1:]
        tl, dl = target(x)[0], draft(x)[0]
        t_loss += torch.nn.functional.cross_entropy(tl, y, reduction="sum").item()
        d_loss += torch.nn.functional.cross_entropy(dl, y, reduction="sum").item()
        agree += (tl.argmax(-1) == dl.argmax(-1)).sum().item()
        count += seq_len
    t_cost = forward_seconds_per_token(target)
    d_cost = forward_seconds_per_token(draft)
    return {"heldout_tokens_scored": int(count),
            "target_heldout_loss": round(t_loss / count, 4),
            "draft_heldout_loss": round(d_loss / count, 4),
            "greedy_agreement": round(agree / count, 4),
            "target_ms_per_token": round(t_cost * 1e3, 3),
            "draft_ms_per_token": round(d_cost * 1e3, 3),
            "draft_to_target_cost": round(d_cost / t_cost, 3),
            "threads": torch.get_num_threads()}
