"""Train a Llama-architecture language model (the bundled target, or a draft distilled from
it) on a token file. Seeded, resumable from periodic safetensors checkpoints, with a rich
progress bar. The same code runs the full recipe and the seconds-long CI test."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from safetensors.torch import load_file, save_file

from specdec.models import LlamaModel, ModelConfig, save_native
from specdec.models.checkpoint import load_native


@dataclass
class OptimConfig:
    """The schedule and batches shared by every training run (models and draft heads)."""
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 0  # torch threads; 0 = torch default


@dataclass
class TrainConfig(OptimConfig):
    grad_clip: float = 1.0
    checkpoint_every: int = 200
    distill_weight: float = 0.0  # >0: mix KL(teacher || student) into the loss
    distill_temperature: float = 1.0


def lr_at(step: int, cfg: OptimConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def sample_batch(tokens: np.ndarray, cfg: OptimConfig, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    rows = [torch.from_numpy(tokens[s:s + cfg.seq_len + 1].astype(np.int64)) for s in starts.tolist()]
    return torch.stack(rows)


def _optimizer(model: LlamaModel, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95))


def save_checkpoint(path: Path, model: LlamaModel, opt: torch.optim.Optimizer, step: int,
                    gen: torch.Generator, elapsed_seconds: float = 0.0) -> None:
    path.mkdir(parents=True, exist_ok=True)
    save_native(model, path / "model")
    tensors = {"rng": gen.get_state()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    save_file(tensors, str(path / "optimizer.safetensors"))
    (path / "state.json").write_text(json.dumps({"step": step, "elapsed_seconds": round(elapsed_seconds, 1)}))


def load_checkpoint(path: Path, opt: torch.optim.Optimizer,
                    gen: torch.Generator) -> tuple[LlamaModel, int, float]:
    model = load_native(path / "model", "float32")
    tensors = load_file(str(path / "optimizer.safetensors"))
    gen.set_state(tensors.pop("rng"))
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    sd = opt.state_dict()
    sd["state"] = state
    opt.load_state_dict(sd)
    state = json.loads((path / "state.json").read_text())
    return model, state["step"], state.get("elapsed_seconds", 0.0)


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


def train_lm(model_config: ModelConfig, tokens: np.ndarray, out: str | Path, cfg: TrainConfig,
             teacher: LlamaModel | None = None, log=print) -> tuple[LlamaModel, float]:
    """Train from scratch (or resume from out/checkpoint); return the float32 model and the
    training seconds of all runs of this training (resumes included)."""
    out = Path(out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = LlamaModel(model_config)
    opt = _optimizer(model, cfg)
    start, earlier = 0, 0.0
    ckpt = out / "checkpoint"
    if (ckpt / "state.json").is_file():
        loaded, start, earlier = load_checkpoint(ckpt, opt, gen)
        model.load_state_dict(loaded.state_dict())
        log(f"resumed from {ckpt} at step {start}")
    (out).mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    model.train()
    if teacher is not None:
        teacher.eval()
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn()]
    t0 = time.time()
    with Progress(*columns) as progress:
        task = progress.add_task(f"train {out.name}", total=cfg.steps, completed=start, loss=float("nan"))
        for step in range(start, cfg.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            batch = sample_batch(tokens, cfg, gen)
            x, y = batch[:, :-1], batch[:, 1:]
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            if teacher is not None and cfg.distill_weight > 0:
                with torch.no_grad():
                    t_logp = F.log_softmax(teacher(x).float() / cfg.distill_temperature, -1)
                s_logp = F.log_softmax(logits / cfg.distill_temperature, -1)
                kl = F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True,
                              reduction="batchmean")
                loss = (1 - cfg.distill_weight) * loss + cfg.distill_weight * kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            progress.update(task, advance=1, loss=loss.item())
            if (step + 1) % 50 == 0 and not progress.console.is_terminal:  # a log file: one line per 50
                log(f"train {out.name} step {step + 1}/{cfg.steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
                save_checkpoint(ckpt, model, opt, step + 1, gen, earlier + time.time() - t0)
    log(f"trained {cfg.steps - start} steps in {time.time() - t0:.0f}s")
    total = earlier + time.time() - t0
    save_checkpoint(ckpt, model, opt, max(cfg.steps, start), gen, total)
    return model, total
