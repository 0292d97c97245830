"""Read and write Hugging Face model folders. Weights come only from safetensors files: pickle
checkpoints (.bin/.pt) are refused because unpickling can run arbitrary code."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.models.config import ModelConfig
from specdec.models.llama import LlamaModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise SpecdecError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def read_hf_config(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecdecError(f"model folder {str(folder)!r} does not exist or is not a directory")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise SpecdecError(f"{str(folder)!r} is not a Hugging Face model folder: no config.json")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{cfg} is not valid JSON: {e}") from None


def safetensors_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    pickles = [p.name for p in folder.iterdir()
               if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    if pickles:
        raise SpecdecError(
            f"{str(folder)!r} has only pickle checkpoints ({', '.join(sorted(pickles))}); "
            "specdec loads safetensors only (convert with transformers' save_pretrained("
            "safe_serialization=True))")
    raise SpecdecError(f"{str(folder)!r} has no model.safetensors weights")


def load_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in safetensors_files(folder):
        state.update(load_file(str(f)))
    return state


def translate_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names match our module names; drop buffers HF sometimes stores (rotary inv_freq)."""
    return {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}


def load_native(folder: str | Path, dtype: str | torch.dtype = "float32",
                device: str = "cpu") -> LlamaModel:
    config = ModelConfig.from_hf_dict(read_hf_config(folder))
    model = LlamaModel(config)
    state = translate_hf_names(load_state_dict(folder))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SpecdecError(f"weights in {str(folder)!r} do not fit the config: missing "
                           f"{missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device=device, dtype=parse_dtype(dtype)).eval()


def save_native(model: LlamaModel, folder: str | Path, dtype: torch.dtype | None = None,
                generation_config: dict | None = None) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(dtype or model.dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
