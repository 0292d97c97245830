"""`specdec bench-serve`'s output: the table (one row per server and concurrency) and the
plot (tokens/s, time to first token and per-token latency against concurrency)."""
from __future__ import annotations

from specdec.bench.serve_load import LevelReport
from specdec.extras import require


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def format_table(reports: list[LevelReport]) -> str:
    head = ("target", "C", "tok/s", "req/s", "TTFT p50", "p99", "ITL p50", "p99", "TPOT p50", "p99", "tok/chunk",
            "ok", "errors")
    rows = [head]
    for r in reports:
        rows.append((r.target, str(r.concurrency), f"{r.tokens_per_second:.1f}", f"{r.requests_per_second:.2f}",
                     _ms(r.ttft_p50_ms), _ms(r.ttft_p99_ms), _ms(r.itl_p50_ms), _ms(r.itl_p99_ms),
                     _ms(r.tpot_p50_ms), _ms(r.tpot_p99_ms),
                     "-" if r.mean_tokens_per_chunk is None else f"{r.mean_tokens_per_chunk:.2f}",
                     f"{r.completed}/{r.requests}", str(r.errors)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines) + "\n(latencies in ms; TTFT = time to first token, ITL = per-token gap, " \
                             "TPOT = time per output token after the first, per request)"
    for r in reports:
        for e in r.error_samples:
            out += f"\n{r.target} C={r.concurrency}: {e}"
    return out


def plot(reports: list[LevelReport], path: str) -> None:
    require("matplotlib", "bench", "--plot").use("Agg")
    import matplotlib.pyplot as plt

    panels = (("tokens_per_second", None, "aggregate tokens/s"),
              ("ttft_p50_ms", "ttft_p99_ms", "time to first token (ms)"),
              ("itl_p50_ms", "itl_p99_ms", "per-token latency (ms)"))
    levels = sorted({r.concurrency for r in reports})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    names = list(dict.fromkeys(r.target for r in reports))
    for ax, (p50, p99, title) in zip(axes, panels):
        for i, name in enumerate(names):
            rs = [r for r in reports if r.target == name]
            xs = [r.concurrency for r in rs]
            color = f"C{i}"
            ax.plot(xs, [getattr(r, p50) for r in rs], "o-", color=color, label=name if p99 is None else f"{name} p50")
            if p99 is not None:
                ax.plot(xs, [getattr(r, p99) for r in rs], "x--", color=color, label=f"{name} p99")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
