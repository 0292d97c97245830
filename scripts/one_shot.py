"""One-shot CLI calls: every `specdec generate` in a fresh process (import, load, calibration
and the generation itself), methods taking turns prompt by prompt, so a cold process's first
generation is what is measured. Reports decoding tokens/s (new tokens over the generation's
wall time less its prefill, from --json stats) per method and dtype and its ratio to `none`.

    python scripts/one_shot.py --dtypes float32,bfloat16 --temperature 1 --prompts 3 --tokens 160
    python scripts/one_shot.py ... --seed 0    # every method writes the same (plain sampling's) text
    python scripts/one_shot.py --methods none,eagle,eagle@fresh ...   # @fresh: --no-memory

Controller memory (specdec.spec.control.memory.py): the calls share one memory file, new and
empty for each run (--memory-file names it), so a run starts cold and later calls start from
what earlier calls of the same method, dtype and temperature learned, as a user's successive
calls would; a method suffixed @fresh runs with --no-memory (every call starts blind).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec.data.prompts import build_suite


def one_call(prompt: str, method: str, dtype: str, temperature: float, tokens: int, target: str | None,
             seed: int | None = None, memory_file: str | None = None) -> dict:
    base, _, mode = method.partition("@")
    cmd = [str(Path(sys.executable).with_name("specdec")), "generate", prompt, "--method", base, "--dtype", dtype,
           "--temperature", str(temperature), "--max-new-tokens", str(tokens), "--json"]
    if mode == "fresh":
        cmd.append("--no-memory")
    if target:
        cmd += ["--target", target]
    if seed is not None:  # seed-invariant sampling: every method writes plain sampling's text
        cmd += ["--seed", str(seed), "--seed-mode", "invariant"]
    env = dict(os.environ, SPECDEC_CONTROLLER_MEMORY=memory_file) if memory_file else None
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)["stats"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="none,draft,ngram,medusa,eagle")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--target", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--memory-file", default=None, help="the calls' controller memory (default: a new empty file)")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed-invariant sampling (prompt i gets seed + i): the same text from every method, "
                         "so the ratios compare speed alone; without it each method samples its own text")
    args = ap.parse_args()
    prompts = [p.text for p in build_suite(args.prompts, ["code"])]
    methods = args.methods.split(",")
    memory_file = args.memory_file or os.path.join(tempfile.mkdtemp(prefix="one-shot-"), "controllers.json")
    rows = []
    for dtype in args.dtypes.split(","):
        speeds: dict[str, list[float]] = {m: [] for m in methods}
        for i, prompt in enumerate(prompts):
            seed = None if args.seed is None else args.seed + i
            for method in methods:
                stats = one_call(prompt, method, dtype, args.temperature, args.tokens, args.target, seed,
                                 memory_file)
                # decoding only: at T > 0 each method samples its own text, and a short answer
                # would otherwise be dominated by its prompt's prefill
                speeds[method].append(stats["new_tokens"] / (stats["wall_seconds"] - stats["prefill_seconds"]))
        base = statistics.mean(speeds["none"]) if "none" in speeds else None
        for method in methods:
            mean = statistics.mean(speeds[method])
            row = {"dtype": dtype, "method": method, "decode_tokens_per_second": round(mean, 1),
                   "ratio_to_none": round(mean / base, 3) if base else None, "per_prompt": speeds[method]}
            rows.append(row)
            ratio = f"{row['ratio_to_none']:.2f}x" if base else "-"
            print(f"{dtype:9s} T={args.temperature:g} {method:7s} {mean:7.1f} tok/s  {ratio}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
