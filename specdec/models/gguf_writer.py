"""Write a llama-family model as GGUF with gguf's GGUFWriter, laid out the way llama.cpp's
convert_hf_to_gguf.py writes it (Q/K rows permuted for llama, 1-D tensors kept in float32,
byte-level BPE vocabulary with llama.cpp's pre-tokenizer name), so llama.cpp and ollama run
exactly these weights."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.models.config import ModelConfig
from specdec.models.gguf import GLOBAL_NAMES, LAYER_NAMES, PERMUTED_ARCHITECTURES, permute_qk

# outtype -> (tensor type name, llama.cpp file type name)
OUTTYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"),
            "q8_0": ("Q8_0", "MOSTLY_Q8_0"), "q4_0": ("Q4_0", "MOSTLY_Q4_0"), "q4_1": ("Q4_1", "MOSTLY_Q4_1")}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def gguf_name(name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (inverse of gguf.native_name)."""
    base, _, suffix = name.rpartition(".")
    for g, native in GLOBAL_NAMES.items():
        if base == native:
            return f"{g}.{suffix}"
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"]:
        for g, native in LAYER_NAMES.items():
            if parts[3] == native:
                return f"blk.{parts[2]}.{g}.{suffix}"
    raise SpecdecError(f"tensor {name!r} has no GGUF name (not a llama-family weight)")


def pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's name for a byte-level pre-tokenizer from tokenizer.json."""
    def byte_level(p):
        return (isinstance(p, dict) and p.get("type") == "ByteLevel" and p.get("use_regex", True)
                and not p.get("add_prefix_space", False))

    if byte_level(pre):
        return "gpt-2"
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else None
    if (steps and len(steps) == 2 and steps[0] == {"type": "Digits", "individual_digits": True}
            and byte_level(steps[1])):
        return "smollm"
    raise SpecdecError(f"the tokenizer's pre-tokenizer {json.dumps(pre)[:200]} has no llama.cpp name that "
                       "specdec knows (supported: GPT-2 byte-level, digits + byte-level as in SmolLM2)")


def gguf_vocab(tokenizer, vocab_size: int) -> dict[str, Any]:
    """tokens, token types, merges and pre-tokenizer name of a byte-level BPE tokenizer."""
    data = json.loads(tokenizer.to_str())
    model = data.get("model") or {}
    if model.get("type") != "BPE" or (data.get("decoder") or {}).get("type") != "ByteLevel":
        raise SpecdecError(f"only byte-level BPE tokenizers can be written to GGUF; this one is "
                           f"{model.get('type')} with decoder {(data.get('decoder') or {}).get('type')}")
    if data.get("normalizer") is not None:
        raise SpecdecError("the tokenizer has a normalizer, which llama.cpp's byte-level BPE does not apply")
    pre = pre_tokenizer_name(data.get("pre_tokenizer"))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if max(vocab.values()) >= vocab_size:
        raise SpecdecError(f"the tokenizer has ids up to {max(vocab.values())} but the model's "
                           f"vocabulary is {vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [TOKEN_UNUSED] * vocab_size
    for text, i in vocab.items():
        tokens[i], types[i] = text, TOKEN_NORMAL
    for added in data.get("added_tokens", []):
        types[added["id"]] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre}


def _tensor_data(w: torch.Tensor, outtype: str):
    """(array, raw dtype or None) for add_tensor: 1-D tensors and rows that do not fill whole
    quantization blocks stay float32, as convert_hf_to_gguf.py and llama-quantize do."""
    import gguf

    arr = w.detach().to(torch.float32).cpu().numpy()
    kind = gguf.GGMLQuantizationType[OUTTYPES[outtype][0]]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if arr.ndim == 1 or kind == gguf.GGMLQuantizationType.F32 or arr.shape[-1] % block:
        return arr, None
    if kind == gguf.GGMLQuantizationType.F16:
        return arr.astype(np.float16), None
    return gguf.quants.quantize(arr, kind), kind


def write_gguf(out: str | Path, config: dict[str, Any], state: dict[str, torch.Tensor], tokenizer,
               tokenizer_config: dict[str, Any], eos_ids: tuple[int, ...], outtype: str = "f32",
               name: str | None = None) -> Path:
    """Write `state` (specdec's names, Hugging Face row order) with its config and tokenizer."""
    from specdec.extras import require

    gguf = require("gguf", "gguf", "writing GGUF files")
    if outtype not in OUTTYPES:
        raise SpecdecError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    cfg = ModelConfig.from_hf_dict(config)
    arch = "qwen2" if cfg.model_type == "qwen2" else "llama"  # llama.cpp runs Mistral as llama
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "linear"):
        raise SpecdecError(f"rope scaling {kind!r} cannot be written to GGUF by specdec (none and linear can)")
    vocab = gguf_vocab(tokenizer, cfg.vocab_size)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type("model")
    w.add_name(name or out.stem)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(scaling["factor"]))
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType[OUTTYPES[outtype][1]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    ids = {t: i for i, t in enumerate(vocab["tokens"])}
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else ids.get(_text(tokenizer_config.get("bos_token")))
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos_ids:
        w.add_eos_token_id(int(eos_ids[0]))
    if (pad := ids.get(_text(tokenizer_config.get("pad_token")))) is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(bool(tokenizer_config.get("add_bos_token", False)))
    if isinstance(tokenizer_config.get("chat_template"), str):
        w.add_chat_template(tokenizer_config["chat_template"])
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    for native, tensor in state.items():
        if native == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gname = gguf_name(native)
        part = gname.split(".")[-2]
        if arch in PERMUTED_ARCHITECTURES and part in heads:
            tensor = permute_qk(tensor, heads[part])
        arr, raw = _tensor_data(tensor, outtype)
        w.add_tensor(gname, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _text(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
