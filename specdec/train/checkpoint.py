"""A training run's checkpoint folder, so an interrupted or extended run resumes exactly:
model/ (the weights as a native model folder; a draft head's: head.safetensors),
optimizer.safetensors (AdamW's moments plus the batch sampler's RNG state) and state.json
(step, training seconds so far)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.models import LlamaModel, save_native
from specdec.models.checkpoint import load_native

HEAD_WEIGHTS = "head.safetensors"


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
                    gen: torch.Generator, elapsed_seconds: float = 0.0) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if isinstance(model, LlamaModel):
        save_native(model, path / "model")
    else:  # a draft head: its own state dict (the head folder's config is written at the end)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / HEAD_WEIGHTS))
    tensors = {"rng": gen.get_state()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    save_file(tensors, str(path / "optimizer.safetensors"))
    (path / "state.json").write_text(json.dumps({"step": step, "elapsed_seconds": round(elapsed_seconds, 1)}))


def restore_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                       gen: torch.Generator) -> tuple[int, float]:
    """Load the checkpoint into model, opt and gen (in place); return its step and the
    training seconds it had accumulated."""
    if isinstance(model, LlamaModel):
        model.load_state_dict(load_native(path / "model", "float32").state_dict())
    else:
        model.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
    tensors = load_file(str(path / "optimizer.safetensors"))
    gen.set_state(tensors.pop("rng"))
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    sd = opt.state_dict()
    sd["state"] = state
    opt.load_state_dict(sd)
    info = json.loads((path / "state.json").read_text())
    return info["step"], info.get("elapsed_seconds", 0.0)
