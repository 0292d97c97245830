"""The bundled model family's recipe: corpus -> tokenizer -> token files -> target -> draft.
Presets are data; `specdec train ...` calls these functions."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from specdec.data.corpus import read_text, split_files
from specdec.models import ModelConfig
from specdec.train.tokenizer import EOS, save_tokenizer, train_tokenizer

VOCAB_SIZE = 8192

PRESETS: dict[str, ModelConfig] = {
    # ~11M parameters, 8 layers: the bundled target.
    "target": ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=320, intermediate_size=864,
                          num_hidden_layers=8, num_attention_heads=5, num_key_value_heads=1,
                          max_position_embeddings=1024, rope_theta=10000.0,
                          tie_word_embeddings=True),
    # 0.79M non-embedding parameters (< 1/8 of the target's 8.6M), 2 layers: the bundled draft.
    "draft": ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=192, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                         max_position_embeddings=1024, tie_word_embeddings=True),
    # seconds-long CI runs
    "tiny": ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        max_position_embeddings=256, tie_word_embeddings=True),
}


def preset(name: str, tokenizer: Tokenizer) -> ModelConfig:
    eos = tokenizer.token_to_id(EOS)
    return replace(PRESETS[name], vocab_size=tokenizer.get_vocab_size(), bos_token_id=eos,
                   eos_token_id=eos)


def build_tokenizer(corpus_root: str | Path, out: str | Path, vocab_size: int = VOCAB_SIZE,
                    max_files: int | None = None) -> Tokenizer:
    train_files, _ = split_files(corpus_root)
    tok = train_tokenizer((read_text(p) for p in train_files[:max_files]), vocab_size)
    save_tokenizer(tok, out)
    return tok


def encode_files(tok: Tokenizer, files: list[Path]) -> np.ndarray:
    """Concatenate files' token ids, each followed by EOS, as uint16."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([read_text(p) for p in files]):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def build_token_files(tok: Tokenizer, corpus_root: str | Path, out: str | Path,
                      max_files: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_files, held = split_files(corpus_root)
    train_ids = encode_files(tok, train_files[:max_files])
    held_ids = encode_files(tok, held[:max_files])
    np.save(out / "train.npy", train_ids)
    np.save(out / "heldout.npy", held_ids)
    return train_ids, held_ids
