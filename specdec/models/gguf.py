"""Read a GGUF file (llama.cpp's format) into what specdec needs: a Hugging Face style config
dict, a state dict in specdec's module names (dequantized to float32), the tokenizer and its
chat template.

GGUF is a plain tensor container (no pickle), so it is allowed next to safetensors. Tensors are
dequantized with the `gguf` package. The tokenizer: gguf_tokenizer.py."""
from __future__ import annotations

import functools
import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.models.gguf_header import TensorInfo, read_header
from specdec.models.heap import trim_heap

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")  # Mistral models are stored as "llama" in GGUF
# convert_hf_to_gguf.py interleaves the Q/K rows of these (llama.cpp's "normal" rope layout);
# qwen2 runs with the NEOX layout, which is Hugging Face's, and is stored unpermuted.
PERMUTED_ARCHITECTURES = ("llama",)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# Control tokens llama.cpp also treats as end of generation, besides the declared eos/eot/eom.
END_OF_GENERATION_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                           "<end_of_turn>", "</s>")
CONTROL_TOKEN = 3  # gguf.TokenType.CONTROL

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


@dataclass
class GGUFFile:
    path: Path
    tensors: list[TensorInfo]  # the directory; each tensor memory-mapped on demand
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    @property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the only .gguf in a folder that is not a
    Hugging Face folder (no config.json). None when `path` is neither."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" or _has_gguf_magic(path) else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        raise SpecdecError(f"{str(path)!r} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}); "
                           "name the one to load")
    return found[0] if found else None


def _has_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF's header (cached per file version, in the process and on disk: gguf's reader
    costs seconds on a 50k vocabulary, ~17 s on a 152k one; gguf_header.py)."""
    path = Path(path).resolve()
    st = path.stat()
    return _open_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    from specdec.extras import require

    require("gguf", "gguf", "reading GGUF files")
    try:
        metadata, tensors = read_header(Path(path), size, mtime_ns, _field_values)
    except Exception as e:  # a parse boundary: any failure means the file is not a valid GGUF
        raise SpecdecError(f"{path!r} is not a readable GGUF file (truncated or corrupt?): "
                           f"{type(e).__name__}: {e}") from None
    return GGUFFile(Path(path), tensors, metadata)


def release_readers() -> None:
    """Forget the parsed GGUF files (a model built from one no longer needs it: a 152k-token
    vocabulary is ~20 MB of Python strings); a later open_gguf reads the header again. Then hand
    the heap freed while unpacking back to the system: glibc keeps freed blocks for reuse, so
    a process's resident memory stayed at its loading peak (50-100 MB above its tensors)."""
    _open_cached.cache_clear()
    gc.collect()
    trim_heap()


def _field_values(fields) -> dict[str, Any]:
    return {name: _field_value(f) for name, f in fields.items()}


def _field_value(f) -> Any:
    from gguf import GGUFValueType

    def scalar(part, kind):
        return bytes(part).decode("utf-8", errors="replace") if kind == GGUFValueType.STRING else part[0].item()

    if f.types[0] == GGUFValueType.ARRAY:
        return [scalar(f.parts[i], f.types[-1]) for i in f.data]
    return scalar(f.parts[f.data[0]], f.types[0])


def _float32_value(x: float) -> float:
    """GGUF stores floats as float32; give back the shortest decimal (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


def hf_config(g: GGUFFile) -> dict[str, Any]:
    """The config.json a Hugging Face folder of this model would have."""
    arch, meta, names = g.architecture, g.metadata, g.tensor_names
    if arch not in SUPPORTED_ARCHITECTURES:
        raise SpecdecError(
            f"GGUF architecture {arch!r} in {str(g.path)!r} is not supported by the native runtime "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}; Mistral is stored as llama); "
            "try --backend transformers")

    def get(key: str, default: Any = KeyError) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is KeyError:
            raise SpecdecError(f"GGUF {str(g.path)!r} lacks the metadata key {arch}.{key}")
        if isinstance(value, list):  # per-layer values: only uniform ones are supported
            if len(set(value)) != 1:
                raise SpecdecError(f"GGUF {str(g.path)!r} has per-layer {arch}.{key} values; not supported")
            value = value[0]
        return value

    heads, hidden = get("attention.head_count"), get("embedding_length")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise SpecdecError(f"GGUF {str(g.path)!r} applies rope to part of each head; not supported")
    if "rope_freqs.weight" in names:
        raise SpecdecError(f"GGUF {str(g.path)!r} has per-frequency rope factors (rope_freqs, Llama 3.1 "
                           "style); the native runtime does not support them: try --backend transformers")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    cfg = {
        "model_type": arch, "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "vocab_size": get("vocab_size", len(tokens)), "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"), "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim, "rope_theta": _float32_value(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": _float32_value(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": get("context_length", 2048), "rope_scaling": _rope_scaling(g, get),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"), "hidden_act": "silu",
    }
    if arch == "llama":
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    return cfg


def _rope_scaling(g: GGUFFile, get) -> dict | None:
    kind = get("rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _float32_value(get("rope.scaling.factor"))}
    raise SpecdecError(f"GGUF {str(g.path)!r} uses rope scaling {kind!r}; the native runtime supports "
                       "none and linear: try --backend transformers")


def native_name(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (and the global tensors)."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if len(parts) == 1 and base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{suffix}"
    raise SpecdecError(f"GGUF tensor {gguf_name!r} is not part of a llama-family model")


def permute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face rows -> llama.cpp rows: each head's two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of permute_qk: llama.cpp rows -> Hugging Face rows."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(tensor) -> torch.Tensor:
    """One GGUF tensor as float32, in torch's (rows, columns) order."""
    from gguf.quants import dequantize as gguf_dequantize

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise SpecdecError(f"GGUF tensor {tensor.name!r} has type {kind}, which specdec does not load "
                           f"(supported: {', '.join(SUPPORTED_TENSOR_TYPES)})")
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    try:
        values = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        return torch.from_numpy(values.reshape(shape).copy())
    except ValueError as e:  # a tensor cut short by a truncated file
        raise SpecdecError(f"GGUF tensor {tensor.name!r} cannot be read (truncated file?): {e}") from None


def load_state_dict(g: GGUFFile) -> dict[str, torch.Tensor]:
    """All tensors, dequantized, named and laid out as specdec's LlamaModel expects."""
    cfg = hf_config(g)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    state = {}
    for tensor in g.tensors:
        name = native_name(tensor.name)
        w = dequantize(tensor)
        kind = tensor.name.split(".")[-2]
        if g.architecture in PERMUTED_ARCHITECTURES and kind in heads:
            w = unpermute_qk(w, heads[kind])
        state[name] = w
    return state


def eos_token_ids(g: GGUFFile) -> tuple[int, ...]:
    """Declared eos/eot/eom ids plus the control tokens llama.cpp also stops on."""
    meta = g.metadata
    ids = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    tokens, types = meta.get("tokenizer.ggml.tokens") or [], meta.get("tokenizer.ggml.token_type") or []
    ids += [i for i, (t, kind) in enumerate(zip(tokens, types))
            if kind == CONTROL_TOKEN and t in END_OF_GENERATION_TEXTS]
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def load_transformers_gguf(path: Path, dtype: torch.dtype = torch.float32):
    """Any architecture transformers reads from GGUF, through its own loader (--backend transformers)."""
    from specdec.extras import require

    transformers = require("transformers", "hf", "the transformers backend")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, local_files_only=True)
    except (ValueError, OSError, KeyError, ImportError, NotImplementedError) as e:
        raise SpecdecError(f"transformers could not load GGUF {str(path)!r}: {e}") from None
    return model.eval()
