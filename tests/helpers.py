"""Tiny random models and tokenizers for fast tests."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specdec.models import LlamaModel, ModelConfig, save_native
from specdec.models.stack import FastPaths
from specdec.train.tokenizer import save_tokenizer, train_tokenizer

SAMPLE_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "héllo wörld — ünïcödé 日本語 テキスト 🙂\n",
] * 20


def char_tokenizer(vocab_size: int, alphabet: str | None = None) -> Tokenizer:
    """A tokenizer whose ids 0..vocab_size-1 are single characters (id 0 = EOS); alphabet:
    the characters of ids 1.. (default a, b, c, ...)."""
    alphabet = alphabet or "".join(chr(ord("a") + i) for i in range(vocab_size - 1))
    chars = ["<|endoftext|>"] + list(alphabet[:vocab_size - 1])
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return tok


def make_model_dir(path: Path, model_type: str = "llama", vocab_size: int | None = None,
                   seed: int = 0, hidden_size: int = 32, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2, tie: bool = False, rope_scaling: dict | None = None,
                   max_pos: int = 256, scale: float = 1.0, tokenizer: str = "bpe", alphabet: str | None = None,
                   bpe_vocab_size: int = 400, special_tokens: tuple[str, ...] = ()) -> Path:
    """Save a random model (HF layout) plus a tokenizer. tokenizer='bpe' trains a small
    byte-level BPE of bpe_vocab_size tokens (vocab_size ignored), plus special_tokens (such as
    FIM markers) at its end; 'char' builds a vocab_size-character tokenizer (alphabet: its
    characters after EOS)."""
    path.mkdir(parents=True, exist_ok=True)
    if tokenizer == "bpe":
        tok = train_tokenizer(SAMPLE_TEXT, vocab_size=bpe_vocab_size)
        tok.add_special_tokens(list(special_tokens))
        save_tokenizer(tok, path)
        vocab_size = tok.get_vocab_size()
    else:
        tok = char_tokenizer(vocab_size, alphabet)
        tok.save(str(path / "tokenizer.json"))
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_pos, tie_word_embeddings=tie, model_type=model_type,
                      rope_scaling=rope_scaling, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02 * scale * 10)
            elif p.dim() == 1 and not isinstance(p, torch.nn.Parameter):
                pass
        if model_type == "qwen2":
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    save_native(model, path, generation_config={"eos_token_id": 0, "bos_token_id": 0})
    return path


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def make_medusa_dir(path: Path, target_dir: Path, num_heads: int = 3, seed: int = 0, nodes: int = 12) -> Path:
    from specdec.models.checkpoint import read_hf_config
    from specdec.spec.proposers.medusa import MedusaHeads, save_medusa
    from specdec.spec.proposers.trees import build_tree

    cfg = read_hf_config(target_dir)
    torch.manual_seed(seed)
    heads = MedusaHeads(num_heads, cfg["hidden_size"])
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    acc = [[0.5 / (r + 1) / (k + 1) for r in range(4)] for k in range(num_heads)]
    save_medusa(heads, path, {"target_vocab_size": cfg["vocab_size"], "tree": build_tree(acc, nodes)})
    return path


def make_eagle_dir(path: Path, target_dir: Path, seed: int = 0, tree: dict | None = None) -> Path:
    from specdec.models.checkpoint import read_hf_config
    from specdec.spec.proposers.eagle_head import EagleHead, save_eagle

    cfg = ModelConfig.from_hf_dict(read_hf_config(target_dir))
    cfg.num_hidden_layers = 1
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    save_eagle(head, path, {"target_vocab_size": cfg.vocab_size,
                            "tree": tree or {"top_k": 3, "depth": 3, "expand": 3, "nodes": 8}})
    return path


def on_the_stack(decoder):
    """Every fast pass on the one-call stack, as this machine times them uncontended (stack 1.4-3x
    faster at every width, SmolLM2 bf16, AMD EPYC Zen 5): load's timing while another test process
    ran beside it once chose the layers for a width, which turns prefix reuse off (its rows would
    not be a fresh prefill's), and failed the reuse tests' checks."""
    model = decoder.engine.target.model
    if model.fast_paths is not None:
        model.fast_paths = FastPaths({width: True for width in model.fast_paths.on_stack})
    return decoder
