"""The target's features, computed once: training a draft head on a 135M-parameter target
must not run the target inside every training step (a SmolLM2 forward over a batch costs more
than the head's whole step). For every token of every training sequence this stores the
target's final hidden state (what its lm_head reads) and the
log-sum-exp of its logits, so that any slice of the target's next-token log-probabilities
(the draft vocabulary's) is `features @ lm_head[slice].T - lse` at training time.

The pass runs in float32 over the serving dtype's weights (`feature_model`): on a CPU without
native bfloat16 products a bfloat16 prefill runs at less than half float32's speed, and the
activations' rounding difference is far below the feature noise the head trains with."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError

FEATURES_FILE = "features.safetensors"


@dataclass
class FeatureSet:
    tokens: torch.Tensor  # [N] int64: the sequences, concatenated
    features: torch.Tensor  # [N, d]: the target's final hidden state after each token
    lse: torch.Tensor  # [N] float32: log-sum-exp of the target's logits after each token
    starts: torch.Tensor  # [S + 1] int64: sequence s is rows starts[s]:starts[s + 1]

    @property
    def num_sequences(self) -> int:
        return len(self.starts) - 1

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"tokens": self.tokens, "features": self.features.contiguous(), "lse": self.lse,
                   "starts": self.starts}, str(folder / FEATURES_FILE))

    @classmethod
    def load(cls, folder: Path) -> FeatureSet:
        path = Path(folder) / FEATURES_FILE
        if not path.is_file():
            raise SpecdecError(f"{str(folder)!r} holds no {FEATURES_FILE} (make it with `specdec train eagle-data`)")
        t = load_file(str(path))
        return cls(t["tokens"], t["features"], t["lse"], t["starts"])

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        return torch.bincount(self.tokens, minlength=vocab_size)


def code_windows(tok, files: list[Path], length: int, budget: int, min_len: int = 64) -> list[list[int]]:
    """Windows of up to `length` tokens cut from each file alone, about `budget` tokens in all,
    picked evenly over the files (sorted by path, so not all from the first packages)."""
    from specdec.data.corpus import read_text

    windows = []
    for enc in tok.encode_batch([read_text(p) for p in files]):
        ids = enc.ids
        windows += [ids[i:i + length] for i in range(0, len(ids), length) if len(ids[i:i + length]) >= min_len]
    total = sum(map(len, windows))
    if total <= budget:
        return windows
    step = total / budget  # > 1: keep every step-th window
    return [w for i, w in enumerate(windows) if int(i / step) != int((i + 1) / step)]


def feature_model(path, dtype: str):
    """The target with its weights as `dtype` rounds them, computed in float32."""
    from specdec.models.checkpoint import load_native

    return load_native(path, dtype).float()


@torch.inference_mode()
def extract_features(model, sequences: list[list[int]], log=print, log_every: int = 200) -> FeatureSet:
    """Run the target (a LlamaModel: feature_model's for training data) over each sequence alone."""
    tokens, feats, lses, starts = [], [], [], [0]
    t0 = time.time()
    for i, seq in enumerate(sequences):
        ids = torch.tensor(seq, dtype=torch.long)
        hidden = model.hidden_states(ids[None])[0]
        lses.append(model.lm_head(hidden).float().logsumexp(-1))
        feats.append(hidden)
        tokens.append(ids)
        starts.append(starts[-1] + len(seq))
        if log_every and (i + 1) % log_every == 0:
            log(f"features: {i + 1}/{len(sequences)} sequences, {starts[-1]} tokens ({time.time() - t0:.0f}s)")
    return FeatureSet(torch.cat(tokens), torch.cat(feats), torch.cat(lses), torch.tensor(starts))


@dataclass
class Windows:
    """Training windows inside sequences (a window never spans two sequences)."""
    begin: torch.Tensor  # [W] first row of each window in the FeatureSet
    length: torch.Tensor  # [W] rows in it (>= 2: an input and what it predicts)

    @classmethod
    def cut(cls, data: FeatureSet, seq_len: int, min_len: int = 16) -> Windows:
        begin, length = [], []
        for s in range(data.num_sequences):
            a, b = int(data.starts[s]), int(data.starts[s + 1])
            for w in range(a, b, seq_len):
                n = min(seq_len + 1, b - w)  # +1: the last input's target row
                if n >= min_len:
                    begin.append(w), length.append(n)
        if not begin:
            raise SpecdecError(f"no training window of at least {min_len} tokens in the feature set")
        return cls(torch.tensor(begin), torch.tensor(length))

    def batch(self, data: FeatureSet, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
        """tokens [B, L], features [B, L, d] (float32), lse [B, L], valid [B, L] (bool), padded
        to the longest window picked."""
        L = int(self.length[index].max())
        rows = self.begin[index, None] + torch.arange(L)
        valid = torch.arange(L)[None] < self.length[index, None]
        rows = torch.where(valid, rows, self.begin[index, None])  # padding reads a real row, masked out
        return data.tokens[rows], data.features[rows].float(), data.lse[rows], valid
