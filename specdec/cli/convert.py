"""`specdec convert SRC OUT`: a Hugging Face folder to a GGUF file (for llama.cpp and ollama),
or a GGUF file to a Hugging Face folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with the chat template, generation_config.json)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.models.checkpoint import ModelSource, load_native, open_model, save_native

HF_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def convert(src: str | Path, out: str | Path, outtype: str = "f32") -> Path:
    """Convert in the direction SRC implies; return what was written."""
    if outtype not in HF_DTYPES:
        raise SpecdecError(f"unknown outtype {outtype!r}; choose one of {', '.join(HF_DTYPES)}")
    source = open_model(src)
    out = Path(out)
    if source.is_gguf:
        if out.suffix.lower() == ".gguf":
            raise SpecdecError(f"{str(source.path)!r} is already GGUF; OUT must be a folder for the "
                               "Hugging Face copy")
        return gguf_to_hf(source, out, outtype)
    if out.suffix.lower() != ".gguf":
        raise SpecdecError(f"OUT must be a .gguf file path when SRC is a Hugging Face folder, got {str(out)!r}")
    return hf_to_gguf(source, out, outtype)


def hf_to_gguf(source: ModelSource, out: Path, outtype: str = "f32") -> Path:
    from specdec.models.gguf_writer import write_gguf

    tokenizer, tokenizer_config = source.tokenizer()
    return write_gguf(out, source.config(), source.state_dict(), tokenizer, tokenizer_config,
                      source.eos_token_ids(), outtype, name=source.path.name)


def gguf_to_hf(source: ModelSource, out: Path, outtype: str = "f32") -> Path:
    if out.exists() and not out.is_dir():
        raise SpecdecError(f"OUT {str(out)!r} exists and is not a folder")
    model = load_native(source, "float32")
    config = source.config()
    eos = list(source.eos_token_ids())
    generation = {"bos_token_id": config.get("bos_token_id"),
                  "eos_token_id": eos[0] if len(eos) == 1 else eos or None}
    save_native(model, out, HF_DTYPES[outtype], generation_config=generation)
    tokenizer, tokenizer_config = source.tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {**tokenizer_config, "model_max_length": config["max_position_embeddings"]}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return out


def cmd_convert(args: argparse.Namespace) -> int:
    written = convert(args.src, args.out, args.outtype)
    print(f"wrote {written}")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("convert", help="convert a Hugging Face folder to GGUF, or GGUF to a Hugging Face folder")
    c.add_argument("src", help="Hugging Face model folder, .gguf file (or folder holding one), or a short "
                               "model name such as smollm2")
    c.add_argument("out", help="a .gguf path (from a folder) or a folder (from a GGUF)")
    c.add_argument("--outtype", default="f32", choices=tuple(HF_DTYPES), help="weight type written (default f32)")
    c.set_defaults(func=cmd_convert)
