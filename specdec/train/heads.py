"""Training of draft heads on a frozen target: Medusa heads (self-distillation on the target's
own next-token distributions k positions ahead) and the EAGLE head (feature regression +
distillation). Each supplies the loss of a batch to the shared training loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from specdec.models import LlamaModel
from specdec.train.features import FeatureSet, Windows
from specdec.train.loop import LoopSettings, OptimConfig, seed_run, train_loop

if TYPE_CHECKING:
    from specdec.spec.proposers.eagle_head import EagleHead
    from specdec.spec.proposers.medusa import MedusaHeads


@dataclass
class HeadTrainConfig(OptimConfig):
    steps: int = 400
    batch_size: int = 8
    warmup: int = 20
    weight_decay: float = 0.0
    head_decay: float = 0.8  # Medusa: weight of head k is head_decay**k
    feature_noise: float = 0.1  # EAGLE: uniform noise on input features
    cls_weight: float = 0.1  # EAGLE: weight of the distillation term vs feature regression
    unroll: int = 1  # EAGLE: >1 also trains on the head's own predicted features (deeper drafts)


def train_medusa(target: LlamaModel, heads: MedusaHeads, tokens: np.ndarray, cfg: HeadTrainConfig, log=print) -> float:
    """Train the heads in place (left in eval mode); return the training seconds."""
    seed_run(cfg)
    target.eval().requires_grad_(False)
    H = len(heads.heads)

    def step_loss(batch: torch.Tensor) -> torch.Tensor:
        x = batch[:, :-1]
        with torch.no_grad():
            logits, hidden = target(x, return_hidden=True)
            target_logp = F.log_softmax(logits.float(), -1)
        feats = heads(hidden)  # [H, B, T, d]
        total = 0.0
        for k in range(1, H + 1):
            pred = F.log_softmax(target.lm_head(feats[k - 1][:, :-k]), -1)
            soft = target_logp[:, k:].exp()
            total = total + cfg.head_decay ** (k - 1) * -(soft * pred).sum(-1).mean()
        return total

    return train_loop(heads, step_loss, tokens, cfg, LoopSettings("medusa"), log)


@torch.inference_mode()
def medusa_rank_accuracy(target: LlamaModel, heads: MedusaHeads, tokens: np.ndarray, seq_len: int = 256,
                         windows: int = 16, max_rank: int = 10) -> list[list[float]]:
    """acc[k-1][r]: share of positions where head k's rank-r token equals the target's argmax
    k positions ahead (what greedy verification accepts)."""
    H = len(heads.heads)
    hits = torch.zeros(H, max_rank)
    counts = torch.zeros(H)
    n = min(windows, (len(tokens) - 1) // seq_len)
    for i in range(n):
        x = torch.from_numpy(tokens[i * seq_len:(i + 1) * seq_len].astype(np.int64))[None]
        logits, hidden = target(x, return_hidden=True)
        choice = logits[0].argmax(-1)
        feats = heads(hidden[0])
        for k in range(1, H + 1):
            top = target.lm_head(feats[k - 1][:-k]).topk(max_rank, -1).indices
            want = choice[k:]
            hits[k - 1] += (top == want[:, None]).float().sum(0)
            counts[k - 1] += len(want)
    return (hits / counts[:, None]).tolist()


def train_eagle(target: LlamaModel, head: EagleHead, tokens: np.ndarray, cfg: HeadTrainConfig, log=print) -> float:
    """Input at position t: (target feature f_t + noise, embedding of token t+1); the head
    predicts f_{t+1}. Loss: smooth L1 on features + cls_weight * cross-entropy against the
    target's next-token distribution at t+1. With cfg.unroll > 1 the head is also trained on
    its own predicted features (as when drafting deeper). Returns the training seconds."""
    seed_run(cfg)
    target.eval().requires_grad_(False)
    noise_gen = torch.Generator().manual_seed(cfg.seed + 1)

    def step_loss(batch: torch.Tensor) -> torch.Tensor:
        x = batch[:, :-1]
        with torch.no_grad():
            logits, feats = target(x, return_hidden=True)
            target_logp = torch.log_softmax(logits.float(), -1)
            noise = (torch.rand(feats.shape, generator=noise_gen) * 2 - 1) * cfg.feature_noise
        inputs = feats + noise
        loss = 0.0
        # step s: input features at position t are the real ones (s = 1) or the head's own
        # predictions from step s-1 (as when drafting deeper), paired with token t+s
        for s in range(1, cfg.unroll + 1):
            n = inputs.shape[1] - 1
            embeds = target.model.embed_tokens(x[:, s:s + n])
            pred = head(inputs[:, :n], embeds, torch.arange(s - 1, s - 1 + n))
            reg = F.smooth_l1_loss(pred, feats[:, s:s + n])
            logp = F.log_softmax(target.lm_head(pred).float(), -1)
            cls = -(target_logp[:, s:s + n].exp() * logp).sum(-1).mean()
            loss = loss + reg + cfg.cls_weight * cls
            inputs = pred
        return loss

    return train_loop(head, step_loss, tokens, cfg, LoopSettings("eagle"), log)


@torch.inference_mode()
def eagle_accuracy(target: LlamaModel, head: EagleHead, tokens: np.ndarray, seq_len: int = 256, windows: int = 16,
                   top_k: int = 5) -> dict:
    """Teacher-forced top-1/top-k agreement of the head's next-next token with the target's argmax."""
    n = min(windows, (len(tokens) - 1) // seq_len)
    top1 = topk = count = 0
    for i in range(n):
        x = torch.from_numpy(tokens[i * seq_len:(i + 1) * seq_len].astype(np.int64))[None]
        logits, feats = target(x, return_hidden=True)
        pred = head(feats[:, :-1], target.model.embed_tokens(x[:, 1:]), torch.arange(seq_len - 1))
        want = logits[0, 1:].argmax(-1)
        top = target.lm_head(pred[0]).topk(top_k, -1).indices
        top1 += (top[:, 0] == want).sum().item()
        topk += (top == want[:, None]).any(-1).sum().item()
        count += len(want)
    return {"top1": round(top1 / count, 4), f"top{top_k}": round(topk / count, 4)}


def train_eagle_features(head: EagleHead, embed: torch.nn.Embedding, target_lm_weight: torch.Tensor,
                         data: FeatureSet, cfg: HeadTrainConfig, settings: LoopSettings, log=print) -> float:
    """train_eagle from stored target features (features.py) for a head with its own output
    projection over a reduced draft vocabulary (head.d2t). The distillation target at each
    position is the target's probability of each draft-vocabulary token: mass outside the
    draft vocabulary can never be drafted, so it weighs nothing. Padding rows of short
    windows are masked out of both losses. Returns the training seconds."""
    seed_run(cfg)
    windows = Windows.cut(data, cfg.seq_len)
    kept_weight = target_lm_weight[head.d2t].float()  # [N, d]: the target's logits over the draft vocabulary
    noise_gen = torch.Generator().manual_seed(cfg.seed + 1)

    def sample(gen: torch.Generator):
        return windows.batch(data, torch.randint(0, len(windows.begin), (cfg.batch_size,), generator=gen))

    def step_loss(batch) -> torch.Tensor:
        tokens, feats, lse, valid = batch
        with torch.no_grad():
            target_p = (feats @ kept_weight.T - lse[..., None]).exp()
            noise = (torch.rand(feats.shape, generator=noise_gen) * 2 - 1) * cfg.feature_noise
            token_embeds = embed(tokens).float()
        inputs = feats + noise
        loss = 0.0
        for s in range(1, cfg.unroll + 1):  # as in train_eagle: s > 1 feeds the head its own predictions
            n = inputs.shape[1] - 1
            pred = head(inputs[:, :n], token_embeds[:, s:s + n], torch.arange(s - 1, s - 1 + n))
            mask = valid[:, s:s + n].float()
            reg = F.smooth_l1_loss(pred, feats[:, s:s + n], reduction="none").mean(-1)
            cls = -(target_p[:, s:s + n] * F.log_softmax(head.lm_head(pred).float(), -1)).sum(-1)
            loss = loss + ((reg + cfg.cls_weight * cls) * mask).sum() / mask.sum().clamp(min=1)
            inputs = pred
        return loss

    return train_loop(head, step_loss, None, cfg, settings, log, sample=sample)


@torch.inference_mode()
def eagle_feature_accuracy(head: EagleHead, embed: torch.nn.Embedding, target_lm_weight: torch.Tensor,
                           data: FeatureSet, depth: int = 3, seq_len: int = 256, max_windows: int = 64) -> dict:
    """Held-out agreement of the head's top-1 draft with the target's argmax, teacher-forced on
    tokens, at draft depth 1..depth (depth s reads the head's own features from step s-1, as a
    chain draft does), top-5 agreement at depth 1 (what a tree's first level offers), and the
    draft vocabulary's coverage of the target's argmax tokens."""
    windows = Windows.cut(data, seq_len)
    index = torch.arange(min(max_windows, len(windows.begin)))
    hits, counts = torch.zeros(depth), torch.zeros(depth)
    covered = total = top5 = 0
    for i in index.split(8):
        tokens, feats, _, valid = windows.batch(data, i)
        want = (feats @ target_lm_weight.float().T).argmax(-1)  # the target's greedy token after each row
        covered += (torch.isin(want, head.d2t) & valid).sum().item()
        total += valid.sum().item()
        inputs, embeds = feats, embed(tokens).float()
        for s in range(1, depth + 1):
            n = inputs.shape[1] - 1
            pred = head(inputs[:, :n], embeds[:, s:s + n], torch.arange(s - 1, s - 1 + n))
            top = head.d2t[head.lm_head(pred).topk(5, -1).indices]
            mask = valid[:, s:s + n]
            hits[s - 1] += ((top[..., 0] == want[:, s:s + n]) & mask).sum()
            if s == 1:
                top5 += ((top == want[:, s:s + n, None]).any(-1) & mask).sum().item()
            counts[s - 1] += mask.sum()
            inputs = pred
    return {"top1_by_depth": [round(v, 4) for v in (hits / counts).tolist()],
            "top5_depth1": round(top5 / counts[0].item(), 4), "argmax_coverage": round(covered / total, 4)}
