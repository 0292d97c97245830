"""Train a Llama-architecture language model (the bundled target, or a draft distilled from
it) on a token file, through the shared training loop (seeded, resumable from periodic
checkpoints in out/checkpoint). The same code runs the full recipe and the seconds-long CI test."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.models import LlamaModel, ModelConfig
from specdec.train.loop import LoopSettings, OptimConfig, seed_run, train_loop


@dataclass
class TrainConfig(OptimConfig):
    grad_clip: float = 1.0
    checkpoint_every: int = 200
    distill_weight: float = 0.0  # >0: mix KL(teacher || student) into the loss
    distill_temperature: float = 1.0


def lm_loss(model: LlamaModel, batch: torch.Tensor, cfg: TrainConfig,
            teacher: LlamaModel | None = None) -> torch.Tensor:
    """Next-token cross-entropy; with a teacher and distill_weight > 0, mixed with
    KL(teacher || student) at distill_temperature."""
    x, y = batch[:, :-1], batch[:, 1:]
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    if teacher is None or cfg.distill_weight <= 0:
        return loss
    with torch.no_grad():
        t_logp = F.log_softmax(teacher(x).float() / cfg.distill_temperature, -1)
    s_logp = F.log_softmax(logits / cfg.distill_temperature, -1)
    kl = F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return (1 - cfg.distill_weight) * loss + cfg.distill_weight * kl


def evaluate(model: LlamaModel, tokens: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats/token) over non-overlapping windows."""
    model.eval()
    seq_len = max(1, min(seq_len, len(tokens) - 1))
    n = min(max_windows, (len(tokens) - 1) // seq_len)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(n):
            chunk = torch.from_numpy(tokens[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))[None]
            logits = model(chunk[:, :-1]).float()
            total += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += seq_len
    model.train()
    return total / max(1, count)


def grow_layers(model: LlamaModel, num_layers: int) -> LlamaModel:
    """`model` deepened to num_layers: each new layer (appended after the others) starts as a
    copy of the last one with its attention and MLP output projections zeroed, so the grown
    model computes exactly what `model` did until training moves them (depth up-scaling of a
    trained draft instead of training a deeper one from scratch)."""
    old = model.config.num_hidden_layers
    if num_layers < old:
        raise SpecdecError(f"cannot grow a {old}-layer model to {num_layers} layers")
    grown = LlamaModel(replace(model.config, num_hidden_layers=num_layers))
    state = model.state_dict()
    last = f"model.layers.{old - 1}."
    for i in range(old, num_layers):
        for key in [k for k in state if k.startswith(last)]:
            new = f"model.layers.{i}." + key[len(last):]
            zero = key.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight"))
            state[new] = torch.zeros_like(state[key]) if zero else state[key].clone()
    grown.load_state_dict(state, strict=False)
    return grown


def train_lm(model_config: ModelConfig, tokens: np.ndarray, out: str | Path, cfg: TrainConfig,
             teacher: LlamaModel | None = None, log=print,
             init: LlamaModel | None = None) -> tuple[LlamaModel, float]:
    """Train from scratch, or on from `init`'s weights (fine-tuning; its config is used), or
    resume from out/checkpoint; return the float32 model and the training seconds of all runs
    of this training (resumes included)."""
    out = Path(out)
    seed_run(cfg)
    model = LlamaModel(model_config) if init is None else init.float().train()
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    if teacher is not None:
        teacher.eval()
    settings = LoopSettings(f"train {out.name}", grad_clip=cfg.grad_clip, checkpoint_dir=out / "checkpoint",
                            checkpoint_every=cfg.checkpoint_every)
    seconds = train_loop(model, lambda batch: lm_loss(model, batch, cfg, teacher), tokens, cfg, settings, log)
    return model, seconds
