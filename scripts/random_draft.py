"""Write a draft with the bundled draft's architecture and tokenizer but random weights, for
the adaptivity benchmark (acceptance near 0: the controller must fall back to plain steps):

    python scripts/random_draft.py /tmp/random-draft
    specdec bench --methods none,draft --draft /tmp/random-draft --tasks code,freetext \
        --temperatures 0,1 --json bench/results/random_draft.json
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from specdec.models import LlamaModel, ModelConfig, save_native
from specdec.models.bundled import DEFAULT_DRAFT
from specdec.models.checkpoint import read_hf_config


def main(out: str) -> None:
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig.from_hf_dict(read_hf_config(DEFAULT_DRAFT)))  # random init
    save_native(model, out, torch.bfloat16)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (DEFAULT_DRAFT / name).is_file():
            shutil.copy(DEFAULT_DRAFT / name, Path(out) / name)


if __name__ == "__main__":
    main(sys.argv[1])
