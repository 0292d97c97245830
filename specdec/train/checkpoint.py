"""A training run's checkpoint folder, so an interrupted or extended run resumes exactly:
model/ (the weights as a native model folder), optimizer.safetensors (AdamW's moments plus
the batch sampler's RNG state) and state.json (step, training seconds so far)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.models import LlamaModel, save_native
from specdec.models.checkpoint import load_native


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


def restore_checkpoint(path: Path, model: LlamaModel, opt: torch.optim.Optimizer,
                       gen: torch.Generator) -> tuple[int, float]:
    """Load the checkpoint into model, opt and gen (in place); return its step and the
    training seconds it had accumulated."""
    model.load_state_dict(load_native(path / "model", "float32").state_dict())
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
