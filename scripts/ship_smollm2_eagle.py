"""Copy the trained SmolLM2 EAGLE head (runs/smollm2-eagle/head/model) into
specdec/bundled_models/smollm2-eagle in bfloat16 (the dtype SmolLM2 runs in; the d2t map stays
int64), keeping its config (tree, held-out accuracy, training facts). The model card
(README.md) is written by hand from the measurements in bench/results/README.md.

    python scripts/ship_smollm2_eagle.py [RUN_FOLDER]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from specdec.spec.proposers.eagle_head import load_eagle, save_eagle

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "specdec" / "bundled_models" / "smollm2-eagle"


def main() -> None:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "runs" / "smollm2-eagle" / "head"
    head, meta = load_eagle(run / "model", torch.bfloat16)
    keep = {k: v for k, v in meta.items() if k not in ("model_type", "head_config", "draft_vocab_size")}
    save_eagle(head, DEST, {**keep, "target": "smollm2"})
    size = (DEST / "model.safetensors").stat().st_size
    print(f"{DEST}: {size / 2**20:.1f} MiB; held-out {json.dumps(meta['heldout_accuracy'])}")


if __name__ == "__main__":
    main()
