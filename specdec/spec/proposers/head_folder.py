"""A draft head's folder, the same for Medusa and EAGLE: model.safetensors (the head module's
state dict) next to config.json, whose model_type and shape fields rebuild the module and whose
other fields (tree, measured accuracies, training facts) travel along for the proposer and
the model card."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.errors import SpecdecError
from specdec.spec.proposers.base import read_head_config

Head = TypeVar("Head", bound=nn.Module)


def save_head(head: nn.Module, folder: str | Path, config: dict) -> None:
    """Write the head's weights and config (which must hold model_type and what rebuilds it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_head(folder: str | Path, model_type: str, build: Callable[[dict], Head],
              dtype: torch.dtype = torch.float32) -> tuple[Head, dict]:
    """The head (built from its config by `build`, weights loaded, in eval mode) and its config."""
    cfg = read_head_config(folder, model_type)
    try:
        head = build(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise SpecdecError(f"config.json in {str(folder)!r} lacks or mangles a field of the "
                           f"{model_type} shape: {e!r}") from None
    try:
        head.load_state_dict(load_file(str(Path(folder) / "model.safetensors")))
    except RuntimeError as e:  # missing/unexpected keys or wrong shapes
        first = str(e).strip().splitlines()[-1].strip()
        raise SpecdecError(f"the weights in {str(folder)!r} do not fit its config.json: {first}") from None
    return head.to(dtype).eval(), cfg
