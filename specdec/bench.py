"""`specdec bench`: side-by-side tokens/s of every method in one run, on a fixed prompt suite
(code completion from held-out stdlib files, an edit task that repeats the prompt, free
text), with the `transformers` peer (plain, assisted generation, prompt lookup) on the same
checkpoints and prompts. Speedups are ratios to `none` measured in the same run."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.api import SpecDecoder, load
from specdec.bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.cli_common import add_checkpoint_args, add_threads_arg, apply_threads
from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.models.runner import tensor_bytes
from specdec.prompts import TASKS, build_suite
from specdec.stats import GenerationStats

SPECDEC_METHODS = ("none", "draft", "ngram", "medusa", "eagle")
PEER_METHODS = ("hf", "hf-assisted", "hf-lookup")


@dataclass
class Row:
    method: str
    task: str
    temperature: float
    new_tokens: int
    wall_seconds: float
    tokens_per_second: float
    speedup: float | None = None
    mean_accepted_length: float | None = None
    acceptance_rate: float | None = None
    mean_draft_tokens: float | None = None
    cost_model_bound: float | None = None
    model_memory_mb: float | None = None


class SpecdecRunner:
    def __init__(self, decoder: SpecDecoder):
        self.decoder = decoder

    def memory_mb(self) -> float:
        return self.decoder.memory_bytes() / 2**20

    def run(self, prompt: str, temperature: float, max_new: int, seed: int) -> GenerationStats:
        # ignore_eos: every run produces exactly max_new tokens, so all methods do the same work
        return self.decoder.generate(prompt, temperature=temperature, max_new_tokens=max_new, seed=seed,
                                     ignore_eos=True).stats


class PeerRunner:
    """transformers generate(): plain, with assistant_model, or with prompt_lookup_num_tokens."""

    def __init__(self, mode: str, target_dir: Path, draft_dir: Path | None, tokenizer):
        from specdec.models.hf_backend import load_transformers

        self.mode = mode
        self.model = load_transformers(target_dir)
        self.assistant = load_transformers(draft_dir) if mode == "hf-assisted" else None
        self.tokenizer = tokenizer

    def memory_mb(self) -> float:
        """Weights only: transformers' dynamic caches are transient."""
        models = [self.model] + ([self.assistant] if self.assistant is not None else [])
        return sum(tensor_bytes([*m.parameters(), *m.buffers()]) for m in models) / 2**20

    @torch.inference_mode()
    def run(self, prompt: str, temperature: float, max_new: int, seed: int) -> GenerationStats:
        ids = torch.tensor([self.tokenizer.encode(prompt)])
        kw = dict(max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=None, pad_token_id=0,
                  attention_mask=torch.ones_like(ids), do_sample=temperature > 0)
        if temperature > 0:
            kw.update(temperature=temperature, top_k=0, top_p=1.0)
        if self.assistant is not None:
            kw["assistant_model"] = self.assistant
        if self.mode == "hf-lookup":
            kw["prompt_lookup_num_tokens"] = 10
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = self.model.generate(ids, **kw)
        stats = GenerationStats(self.mode)
        stats.wall_seconds = time.perf_counter() - t0
        stats.new_tokens = out.shape[1] - ids.shape[1]
        return stats


def cost_model_bound(stats, plain_seconds_per_token: float) -> float | None:
    """Speedup the measured acceptance allows if a K-token verify cost one plain forward:
    tokens per step / (1 + K * draft_cost / target_cost)."""
    if not stats.target_forwards or not stats.drafted_tokens or plain_seconds_per_token <= 0:
        return None
    mean_k = stats.drafted_tokens / stats.target_forwards
    c = (stats.draft_seconds / stats.drafted_tokens) / plain_seconds_per_token
    return stats.mean_accepted_length / (1 + mean_k * c)


def run_bench(methods: list[str], temperatures: list[float], tasks: list[str], target: str | None,
              draft: str | None, max_new_tokens: int, per_task: int, draft_tokens: int | None,
              dtype: str = "float32", heads: dict | None = None, repeats: int = 1, log=print) -> list[Row]:
    target_dir = Path(target) if target else DEFAULT_TARGET
    draft_dir = Path(draft) if draft else (DEFAULT_DRAFT if target is None else None)
    heads = heads or {}
    prompts = [p for p in build_suite(per_task) if p.task in tasks]
    runners = {}
    for m in methods:
        base, _, fixed = m.partition(":")  # "draft:4" = draft with a fixed K of 4
        k = int(fixed) if fixed.isdigit() else draft_tokens
        if fixed and not fixed.isdigit():
            raise SpecdecError(f"bad method {m!r}: use NAME or NAME:K with an integer K")
        if base in SPECDEC_METHODS:
            drafter = {"draft": draft, "medusa": heads.get("medusa"), "eagle": heads.get("eagle")}.get(base)
            runners[m] = SpecdecRunner(load(target=target, draft=drafter, method=base, dtype=dtype,
                                            draft_tokens=k))
        elif base in PEER_METHODS and not fixed:
            if m == "hf-assisted" and draft_dir is None:
                raise SpecdecError("hf-assisted needs a draft model (--draft)")
            tok = load(target=target).tokenizer
            runners[m] = PeerRunner(m, target_dir, draft_dir, tok)
        else:
            raise SpecdecError(f"unknown bench method {m!r}; choose from "
                               f"{', '.join(SPECDEC_METHODS + PEER_METHODS)} (NAME:K fixes K)")
    for runner in runners.values():  # warm-up
        runner.run(prompts[0].text, 0.0, 8, 0)
    rows = []
    for task in tasks:
        task_prompts = [p for p in prompts if p.task == task]
        for temp in temperatures:
            plain_tps = None
            # round robin over methods, prompt by prompt: drifts in machine speed hit all alike
            runs: dict[str, list] = {m: [] for m in runners}
            for i in range(repeats * len(task_prompts)):
                for m, runner in runners.items():
                    runs[m].append(runner.run(task_prompts[i % len(task_prompts)].text, temp, max_new_tokens, seed=i))
            for m, runner in runners.items():
                s = GenerationStats.merge(runs[m])
                row = Row(m, task, temp, s.new_tokens, round(s.wall_seconds, 3), round(s.tokens_per_second, 2),
                          model_memory_mb=round(runner.memory_mb(), 1))
                if m == "none":
                    plain_tps = s.tokens_per_second
                if m.partition(":")[0] in SPECDEC_METHODS and m != "none":
                    row.mean_accepted_length = round(s.mean_accepted_length, 3)
                    row.acceptance_rate = round(s.acceptance_rate, 3)
                    row.mean_draft_tokens = round(s.drafted_tokens / max(1, s.target_forwards), 2)
                    if plain_tps:
                        bound = cost_model_bound(s, 1.0 / plain_tps)
                        row.cost_model_bound = round(bound, 3) if bound else None
                rows.append(row)
                log(f"{task:9s} T={temp:<4} {m:12s} {row.tokens_per_second:8.1f} tok/s")
            if plain_tps:
                for row in rows:
                    if row.task == task and row.temperature == temp:
                        row.speedup = round(row.tokens_per_second / plain_tps, 3)
    return rows


def _fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def print_table(rows: list[Row]) -> None:
    Table = require("rich.table", "bench", "the bench table").Table
    table = Table(title="specdec bench (speedup = tokens/s ratio to `none` in the same run)")
    for col in ("task", "T", "method", "tok/s", "speedup", "mean acc. len", "acc. rate", "mean K",
                "bound", "mem MB"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.task, f"{r.temperature:g}", r.method, _fmt(r.tokens_per_second, "{:.1f}"),
                      _fmt(r.speedup), _fmt(r.mean_accepted_length), _fmt(r.acceptance_rate),
                      _fmt(r.mean_draft_tokens), _fmt(r.cost_model_bound), _fmt(r.model_memory_mb, "{:.0f}"))
    require("rich.console", "bench", "the bench table").Console().print(table)


def plot(rows: list[Row], path: str) -> None:
    require("matplotlib", "bench", "--plot").use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    tasks = sorted({r.task for r in rows}, key=TASKS.index)
    methods = [m for m in dict.fromkeys(r.method for r in rows) if m != "none"]
    temps = sorted({r.temperature for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    width = 0.8 / max(1, len(methods))
    for ax, task in zip(axes[0], tasks):
        for j, m in enumerate(methods):
            vals = [next((r.speedup or 0 for r in rows if r.task == task and r.method == m and r.temperature == t), 0)
                    for t in temps]
            ax.bar([i + j * width for i in range(len(temps))], vals, width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(temps))], [f"T={t:g}" for t in temps])
        ax.set_title(task)
        ax.set_ylabel("speedup vs none")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdecError(f"--temperatures must be comma-separated numbers, got {text!r}") from None


def check_extras(methods: list[str], plot_path: str | None) -> None:
    """Fail before a long run, not at its end, when a package for the output is missing."""
    require("rich.table", "bench", "the bench table")
    if plot_path:
        require("matplotlib", "bench", "--plot")
    if any(m in PEER_METHODS for m in methods):
        require("transformers", "bench", "the transformers peer (hf, hf-assisted, hf-lookup)")


def cmd_bench(args: argparse.Namespace) -> int:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            raise SpecdecError(f"unknown task {t!r}; choose from {', '.join(TASKS)}")
    if args.repeats < 1 or args.prompts < 1:
        raise SpecdecError("--repeats and --prompts must be >= 1")
    temps = _floats(args.temperatures)
    if any(t < 0 for t in temps):
        raise SpecdecError("temperatures must be >= 0")
    check_extras(methods, args.plot)
    apply_threads(args)
    rows = run_bench(methods, temps, tasks, args.target, args.draft, args.max_new_tokens, args.prompts,
                     args.draft_tokens, args.dtype, {"medusa": args.medusa, "eagle": args.eagle},
                     args.repeats)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": torch.get_num_threads(), "dtype": args.dtype,
                                               "max_new_tokens": args.max_new_tokens,
                                               "prompts_per_task": args.prompts, "repeats": args.repeats,
                                               "rows": [asdict(r) for r in rows]}, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 0


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark methods side by side (speedup vs none)")
    b.add_argument("--methods", default="none,draft,ngram,medusa,eagle,hf,hf-assisted,hf-lookup")
    b.add_argument("--temperatures", default="0,0.7,1.0")
    b.add_argument("--tasks", default="code,edit,freetext")
    add_checkpoint_args(b, draft_help="draft model for draft and hf-assisted (default: the bundled one "
                                      "for the bundled target)")
    b.add_argument("--medusa", help="Medusa heads folder (default: bundled, for the bundled target)")
    b.add_argument("--eagle", help="EAGLE head folder (default: bundled, for the bundled target)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--prompts", type=int, default=3, help="prompts per task")
    b.add_argument("--repeats", type=int, default=1, help="passes over the prompts (methods take turns)")
    b.add_argument("--draft-tokens", type=int, default=None, help="fixed K (default adaptive)")
    add_threads_arg(b)
    b.add_argument("--json")
    b.add_argument("--plot")
    b.set_defaults(func=cmd_bench)
