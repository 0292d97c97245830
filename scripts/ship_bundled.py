"""Copy the trained models from runs/ into specdec/bundled_models/ with model cards."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "specdec" / "bundled_models"

LICENSE = ("Trained only on the `.py` files of the CPython standard library (excluding test folders and "
           "site-packages), which is distributed under the Python Software Foundation License (PSF "
           "License Agreement). The weights are released with specdec under the MIT license; the PSF "
           "notice applies to the training data.")


def card(name: str, title: str, info: dict, extra: str) -> str:
    tc = info.get("train_config", {})
    hours = info.get("train_seconds_total", info.get("train_seconds_this_run", info.get("train_seconds", 0))) / 60
    lines = [f"# {name}", "", title, "",
             f"- Parameters: {info.get('parameters', 'n/a'):,}" if isinstance(info.get("parameters"), int) else "",
             f"- Training data: CPython {info.get('python', '3.11')} standard library `.py` files; "
             f"{info.get('train_tokens', 'n/a')} training tokens, a deterministic ~1-2% of whole files held out",
             f"- Training time: {hours:.0f} minutes on a 2-core CPU",
             f"- Training config: {json.dumps(tc)}" if tc else "",
             extra, "", "## License", "", LICENSE, ""]
    return "\n".join(line for line in lines if line is not None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--medusa", default="medusa", help="run folder of the Medusa heads to ship")
    ap.add_argument("--eagle", default="eagle", help="run folder of the EAGLE head to ship")
    args = ap.parse_args()
    runs = Path(args.runs)
    pair = json.loads((runs / "pair_eval.json").read_text()) if (runs / "pair_eval.json").is_file() else {}
    DEST.mkdir(parents=True, exist_ok=True)
    for name, src, title in (("pycode-target", runs / "target" / "model",
                              "Llama-architecture Python code model; the default target of specdec."),
                             ("pycode-draft", runs / "draft" / "model",
                              "Small Llama-architecture draft for pycode-target (same tokenizer), distilled "
                              "from the target's next-token distributions.")):
        out = DEST / name
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src, out)
        info = json.loads((out / "training.json").read_text())
        extra = [f"- Held-out loss: {info['heldout_loss_nats_per_token']} nats/token (float32 weights before the "
                 "bfloat16 export; the pair evaluation below uses the shipped weights)"]
        if name == "pycode-target":
            extra.append("- Schedule: 700 steps at peak lr 1.5e-3, then resumed to 1500 steps at peak lr 1e-3 "
                         "(the cosine schedule re-stretched at step 700): about 1.9 passes over the training tokens")
        if name == "pycode-draft":
            extra.append("- Schedule: 400 steps, then resumed to 1000 steps (the cosine schedule re-stretched at "
                         "step 400), distilled from the 700-step target; then resumed to 1300 steps distilled "
                         "from the final 1500-step target. Parts ran beside other trainings, so its wall time "
                         "is inflated")
        if pair:
            extra.append(f"- Pair evaluation (`specdec train eval`): {json.dumps(pair)}")
        (out / "README.md").write_text(card(name, title, info, "\n".join(extra)))
    for name, src, title in (("pycode-target-medusa", runs / args.medusa,
                              "Medusa heads for pycode-target (residual block per head, sharing the "
                              "target's frozen lm_head), self-distilled from the target."),
                             ("pycode-target-eagle", runs / args.eagle,
                              "EAGLE head for pycode-target: fc(feature, embedding) -> one Llama decoder "
                              "layer -> predicted feature, read by the target's frozen lm_head.")):
        out = DEST / name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(src / f, out / f)
        info = json.loads((out / "config.json").read_text())
        info["target"] = "pycode-target"
        (out / "config.json").write_text(json.dumps(info, indent=2) + "\n")
        keys = [k for k in info if k.startswith("heldout") or k.startswith("tree_expected")]
        extra = "\n".join(f"- {k}: {json.dumps(info[k])}" for k in keys)
        if info.get("init"):
            extra += (f"\n- Fine-tuned from the head in {info['init']} (trained before it; see "
                      "scripts/train_bundled.sh for the chain); the training time above is this fine-tune's only")
        (out / "README.md").write_text(card(name, title, info, extra))
    print("shipped:", ", ".join(sorted(p.name for p in DEST.iterdir())))


if __name__ == "__main__":
    main()
