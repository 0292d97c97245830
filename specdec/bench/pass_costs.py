"""The cost curve speculation lives on: ms per target pass over T tokens, next to the
machine's memory-bandwidth bound, for specdec and (when a build is found) llama.cpp on the
same GGUF. A K-token verify pass that costs about a 1-token pass is what makes drafting pay;
plain decoding near the bandwidth bound is what makes the base fast."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.models.runner import NativeRunner, tensor_bytes

WIDTHS = (1, 2, 4, 8, 16, 32)
RATIOS = (4, 8, 16)  # widths reported as a multiple of a 1-token pass: a verify pass's cost
CACHED_TOKENS = 200  # tokens in the cache before each timed pass (a decode step mid-answer)


@dataclass
class CostCurve:
    engine: str
    ms_per_pass: dict[int, float]  # tokens in the pass -> median ms
    bytes_per_pass: int | None = None  # weights read by one pass
    bound_tokens_per_second: float | None = None  # plain decoding at the bandwidth limit


def median_pass_ms(runner: NativeRunner, width: int, repeats: int, exact: bool = False,
                   cached: int = CACHED_TOKENS) -> float:
    """Median ms of a pass over `width` new tokens after `cached` cached ones (exact: with
    exact mode's batch-invariant kernels)."""
    runner.reset()
    runner.extend(list(range(100, 100 + cached)))
    base = runner.length
    times = []
    for _ in range(repeats):
        runner.rollback(base)
        t0 = time.perf_counter()
        runner.extend(list(range(5, 5 + width)), exact=exact)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def weight_bytes_per_pass(runner: NativeRunner) -> int:
    """Bytes of the weights a decode pass reads: everything but the embedding table, of which
    a pass reads a row (unless it is also the output head)."""
    model = runner.model
    embedding = {t.data_ptr() for t in [*model.model.embed_tokens.parameters(), *model.model.embed_tokens.buffers()]}
    head = {t.data_ptr() for t in [*model.lm_head.parameters(), *model.lm_head.buffers()]}
    tied = bool(embedding & head)
    tensors = [t for t in [*model.parameters(), *model.buffers()] if tied or t.data_ptr() not in embedding]
    return tensor_bytes(tensors)


def streaming_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a sum over a large buffer reads (this machine, torch's threads)."""
    buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    buffer.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - t0)
    return buffer.numel() * 4 / best


def specdec_curve(runner: NativeRunner, bandwidth: float, engine: str = "specdec", widths=WIDTHS,
                  repeats: int = 9) -> CostCurve:
    for width in widths:
        median_pass_ms(runner, width, 2)  # warm-up: first calls of each shape pay kernel selection (or compile)
    nbytes = weight_bytes_per_pass(runner)
    return CostCurve(engine, {w: round(median_pass_ms(runner, w, repeats), 2) for w in widths}, nbytes,
                     round(bandwidth / nbytes, 1))


def llama_cpp_curve(llama_bench: Path, gguf: Path, threads: int, bandwidth: float,
                    widths=WIDTHS, repeats: int = 3) -> CostCurve:
    """llama-bench's prompt-processing rate for each width, as ms per pass (it times passes
    from an empty context, specdec's from CACHED_TOKENS: close for short contexts)."""
    command = [str(llama_bench), "-m", str(gguf), "-p", ",".join(map(str, widths)), "-n", "0",
               "-t", str(threads), "-r", str(repeats), "-o", "json"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
        rows = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        raise SpecdecError(f"llama-bench failed on {gguf}: {e}") from None
    ms = {int(r["n_prompt"]): round(1e3 * r["n_prompt"] / r["avg_ts"], 2) for r in rows if r["n_prompt"] in widths}
    size = int(rows[0]["model_size"]) if rows and "model_size" in rows[0] else None
    return CostCurve("llama.cpp", ms, size, round(bandwidth / size, 1) if size else None)


def llama_bench_binary(llama_server: Path) -> Path | None:
    """llama-bench beside llama-server (llama.cpp builds ship both)."""
    path = llama_server.parent / "llama-bench"
    return path if path.is_file() else None


def pass_cost_curves(target: str | Path, dtype: str, quantize: str | None, group_size: int,
                     llama_server: Path | None, llama_gguf: Path | None, compiled: bool = False) -> list[CostCurve]:
    """The cost curves of `specdec bench --pass-costs`: the target as the bench ran it (dtype,
    quantization; compiled: also through inductor, as NAME@compile methods run it), and
    llama.cpp on the bench's GGUF (default: the target written in dtype)."""
    from specdec.bench.peers import llama_cpp_gguf
    from specdec.engine.loading import load_runner

    bandwidth = streaming_bandwidth()
    curves = []
    for engine, compile in [("specdec", False)] + ([("specdec --compile", True)] if compiled else []):
        runner = load_runner(target, dtype, quantize=quantize, group_size=group_size, compile=compile)
        if not isinstance(runner, NativeRunner):
            raise SpecdecError("--pass-costs times the native runtime; this target runs on transformers")
        curves.append(specdec_curve(runner, bandwidth, engine))
        del runner
    bench_binary = llama_bench_binary(llama_server) if llama_server else None
    if bench_binary is not None:
        with tempfile.TemporaryDirectory(prefix="specdec-bench-") as folder:
            gguf = llama_gguf or llama_cpp_gguf(target, dtype, Path(folder))
            curves.append(llama_cpp_curve(bench_binary, gguf, torch.get_num_threads(), bandwidth))
    return curves


def _fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def print_cost_table(curves: list[CostCurve]) -> None:
    Table = require("rich.table", "bench", "the pass-cost table").Table
    table = Table(title="ms per target pass over T tokens (bound: plain tok/s at this machine's streaming bandwidth)")
    for col in ("engine", *(f"T={w}" for w in WIDTHS), *(f"T={w} / T=1" for w in RATIOS), "MB read per pass",
                "bound tok/s", "plain tok/s at T=1", "of bound"):
        table.add_column(col, justify="right")
    for c in curves:
        one = c.ms_per_pass.get(1)
        plain = 1e3 / one if one else None
        table.add_row(c.engine, *(_fmt(c.ms_per_pass.get(w)) for w in WIDTHS),
                      *(_fmt(c.ms_per_pass[w] / one if one and w in c.ms_per_pass else None) for w in RATIOS),
                      _fmt(c.bytes_per_pass / 1e6 if c.bytes_per_pass else None, "{:.0f}"),
                      _fmt(c.bound_tokens_per_second, "{:.1f}"), _fmt(plain, "{:.1f}"),
                      _fmt(plain / c.bound_tokens_per_second if plain and c.bound_tokens_per_second else None,
                           "{:.0%}"))
    console = require("rich.console", "bench", "the pass-cost table").Console
    (console() if sys.stdout.isatty() else console(width=160)).print(table)
