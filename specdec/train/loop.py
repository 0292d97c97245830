"""The one training loop. Language models (from scratch or distilled) and the draft heads
(Medusa, EAGLE) differ only in the module trained and the loss of a batch; everything else is
here: seeded batches, AdamW on a warmup + cosine schedule, gradient clipping, a rich progress
bar (plus a line every 50 steps when the output is a log file), periodic checkpoints with
resume, and the training seconds accumulated over resumed runs."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.errors import SpecdecError
from specdec.train.checkpoint import restore_checkpoint, save_checkpoint


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
class LoopSettings:
    """What the loop needs beyond the schedule: how to label it and where to checkpoint."""
    name: str  # progress bar label and log-line prefix
    grad_clip: float = 1.0
    checkpoint_dir: Path | None = None  # resume from / save to (a LlamaModel's run); None: no checkpoints
    checkpoint_every: int = 0  # steps between checkpoints; 0: only the final one
    log_every: int = 50  # steps between log lines, written only when the console is not a terminal


def lr_at(step: int, cfg: OptimConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def sample_batch(tokens: np.ndarray, cfg: OptimConfig, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    rows = [torch.from_numpy(tokens[s:s + cfg.seq_len + 1].astype(np.int64)) for s in starts.tolist()]
    return torch.stack(rows)


def seed_run(cfg: OptimConfig) -> None:
    """Threads and torch's global seed; call before building the modules to train, whose
    initial weights are drawn from it."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)


def adamw(module: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay on matrices only (not norms, biases)."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95))


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())


def _check(tokens: np.ndarray, cfg: OptimConfig) -> None:
    if cfg.batch_size < 1 or cfg.seq_len < 1:
        raise SpecdecError(f"batch size and sequence length must be at least 1 (got {cfg.batch_size}, {cfg.seq_len})")
    if len(tokens) < cfg.seq_len + 2:
        raise SpecdecError(f"the training data has {len(tokens)} tokens, too few for sequences of "
                           f"{cfg.seq_len} (use a larger corpus or a smaller --seq-len)")


def train_loop(module: torch.nn.Module, loss_of_batch: Callable[[torch.Tensor], torch.Tensor],
               tokens: np.ndarray | None, cfg: OptimConfig, settings: LoopSettings, log=print,
               sample: Callable[[torch.Generator], object] | None = None) -> float:
    """Train module's trainable parameters up to step cfg.steps on batches of tokens (resuming
    from settings.checkpoint_dir when it holds a checkpoint); leave it in eval mode. Returns
    the training seconds of all runs of this training (resumes included). sample: draws a
    batch of another kind from the run's generator (then `tokens` is unused)."""
    if sample is None:
        _check(tokens, cfg)
        sample = lambda gen: sample_batch(tokens, cfg, gen)  # noqa: E731
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = adamw(module, cfg)
    params = [p for p in module.parameters() if p.requires_grad]
    ckpt = settings.checkpoint_dir
    start, earlier = 0, 0.0
    if ckpt is not None and (ckpt / "state.json").is_file():
        start, earlier = restore_checkpoint(ckpt, module, opt, gen)
        log(f"resumed from {ckpt} at step {start}")
    module.train()
    t0 = time.time()
    with _progress() as progress:
        task = progress.add_task(settings.name, total=cfg.steps, completed=start, loss=float("nan"))
        for step in range(start, cfg.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            loss = loss_of_batch(sample(gen))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            opt.step()
            progress.update(task, advance=1, loss=loss.item())
            done = step + 1
            if done % settings.log_every == 0 and not progress.console.is_terminal:
                log(f"{settings.name} step {done}/{cfg.steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
            if ckpt is not None and settings.checkpoint_every and done % settings.checkpoint_every == 0 \
                    and done < cfg.steps:
                save_checkpoint(ckpt, module, opt, done, gen, earlier + time.time() - t0)
    module.eval()
    seconds = time.time() - t0
    log(f"trained {max(0, cfg.steps - start)} steps in {seconds:.0f}s")
    if ckpt is not None:
        save_checkpoint(ckpt, module, opt, max(cfg.steps, start), gen, earlier + seconds)
    return earlier + seconds
