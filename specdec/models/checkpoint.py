"""Where a model's pieces come from: a Hugging Face folder (config.json, safetensors,
tokenizer.json) or a GGUF file, behind one small interface (`ModelSource`), so the rest of
specdec loads either the same way. Weights come only from safetensors or GGUF, plain tensor
formats: pickle checkpoints (.bin/.pt) are refused because unpickling can run arbitrary code."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.models import gguf
from specdec.models.bundled import resolve_model_name
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


@dataclass
class ModelSource:
    """A model folder or GGUF file: its config.json-style dict, weights, tokenizer and eos ids."""
    path: Path  # the Hugging Face folder, or the .gguf file
    gguf_file: gguf.GGUFFile | None = None

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    def config(self) -> dict[str, Any]:
        return gguf.hf_config(self.gguf_file) if self.is_gguf else read_folder_config(self.path)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Weights in specdec's module names (float32 when dequantized from GGUF)."""
        if self.is_gguf:
            return gguf.load_state_dict(self.gguf_file)
        return translate_hf_names(load_state_dict(self.path))

    def tokenizer(self):
        """(tokenizers.Tokenizer, tokenizer_config dict incl. bos/eos token text and chat_template)."""
        if self.is_gguf:
            from specdec.models.gguf_tokenizer import build_tokenizer

            return build_tokenizer(self.gguf_file)
        return read_folder_tokenizer(self.path)

    def eos_token_ids(self) -> tuple[int, ...]:
        if self.is_gguf:
            return gguf.eos_token_ids(self.gguf_file)
        gen_cfg = self.path / "generation_config.json"
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id") if gen_cfg.is_file() else None
        if eos is None:
            eos = self.config().get("eos_token_id")
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, list) else (eos,)


def open_model(path: str | Path | ModelSource) -> ModelSource:
    """A model by path (HF folder, .gguf file, folder holding one .gguf) or short name."""
    if isinstance(path, ModelSource):
        return path
    path = resolve_model_name(path)
    found = gguf.find_gguf(path)
    if found is not None:
        return ModelSource(found, gguf.open_gguf(found))
    if not path.is_dir():
        raise SpecdecError(f"model {str(path)!r} does not exist or is neither a folder nor a .gguf file")
    return ModelSource(path)


def read_hf_config(path: str | Path | ModelSource) -> dict:
    """The config.json dict of a model folder, or the equivalent for a GGUF or a short name."""
    return open_model(path).config()


def read_folder_config(folder: Path) -> dict:
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise SpecdecError(f"{str(folder)!r} is not a Hugging Face model folder: no config.json "
                           "(nor a .gguf file)")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{cfg} is not valid JSON: {e}") from None


def read_folder_tokenizer(folder: Path):
    """tokenizer.json plus tokenizer_config.json; the chat template may also sit beside them in
    chat_template.jinja (where transformers 5 saves it), which then wins as in transformers."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise SpecdecError(f"{str(folder)!r} has no tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    cfg_path = folder / "tokenizer_config.json"
    try:
        config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{cfg_path} is not valid JSON: {e}") from None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        config["chat_template"] = jinja.read_text()
    return tok, config


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


def load_native(path: str | Path | ModelSource, dtype: str | torch.dtype = "float32",
                device: str = "cpu") -> LlamaModel:
    source = open_model(path)
    config = ModelConfig.from_hf_dict(source.config())
    model = LlamaModel(config)
    state = source.state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SpecdecError(f"weights in {str(source.path)!r} do not fit the config: missing "
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
