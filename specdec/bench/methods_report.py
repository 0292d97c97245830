"""`specdec bench`'s results: a row per task, temperature and method, printed as a table and
plotted as speedups over `none`."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from specdec.data.prompts import TASKS
from specdec.extras import require


@dataclass
class Row:
    method: str
    task: str
    temperature: float
    new_tokens: int
    wall_seconds: float
    tokens_per_second: float
    speedup: float | None = None
    # after the prompt's prefill (which a long prompt's tok/s is mostly): None where the run does not say
    decode_tokens_per_second: float | None = None
    decode_speedup: float | None = None
    mean_accepted_length: float | None = None
    acceptance_rate: float | None = None
    mean_draft_tokens: float | None = None
    cost_model_bound: float | None = None
    model_memory_mb: float | None = None  # specdec: weights + KV caches; transformers: weights
    peak_rss_mb: float | None = None  # llama.cpp: the llama-server process's peak resident memory


def _fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def print_table(rows: list[Row]) -> None:
    Table = require("rich.table", "bench", "the bench table").Table
    table = Table(title="specdec bench (speedup = tokens/s ratio to `none` in the same run)")
    for col in ("task", "T", "method", "tok/s", "speedup", "decode tok/s", "decode x", "mean acc. len",
                "acc. rate", "mean K", "bound", "mem MB", "peak RSS MB"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.task, f"{r.temperature:g}", r.method, _fmt(r.tokens_per_second, "{:.1f}"),
                      _fmt(r.speedup), _fmt(r.decode_tokens_per_second, "{:.1f}"), _fmt(r.decode_speedup),
                      _fmt(r.mean_accepted_length), _fmt(r.acceptance_rate),
                      _fmt(r.mean_draft_tokens), _fmt(r.cost_model_bound), _fmt(r.model_memory_mb, "{:.0f}"),
                      _fmt(r.peak_rss_mb, "{:.0f}"))
    # wide enough for every column when the table goes to a file, not a terminal
    console = require("rich.console", "bench", "the bench table").Console
    (console() if sys.stdout.isatty() else console(width=190)).print(table)


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
