"""`specdec bench`: side-by-side tokens/s of every method in one run, on a fixed prompt suite
from held-out stdlib files (specdec.data.prompts: code completion, an edit task that repeats the
prompt, free text; for instruct models chat instructions and a rewrite, in the model's chat
template), with the peers of specdec.bench.peers (transformers: plain, assisted generation,
prompt lookup; llama.cpp: plain and n-gram speculation) on the same weights and prompt ids.
Speedups are ratios to `none` measured in the same run."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import torch

from specdec.bench.llama_cpp import ENV_VAR, LlamaServer, find_llama_server, server_version
from specdec.bench.methods_report import Row, plot, print_table
from specdec.bench.pass_costs import pass_cost_curves, print_cost_table
from specdec.bench.peers import HF_METHODS, LLAMA_CPP_METHODS, LlamaCppPeer, TransformersPeer, llama_cpp_gguf
from specdec.chat.template import ChatTemplate
from specdec.cli.common import add_checkpoint_args, add_quantize_args, add_threads_arg, apply_threads
from specdec.data.prompts import RAW_TASKS, TASKS, build_suite, render_chat, render_fim
from specdec.engine.decoder import SpecDecoder, load
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.models.bundled import DEFAULT_TARGET, default_head, default_quantize, resolve_model_name
from specdec.models.checkpoint import read_hf_config
from specdec.models.gguf import find_gguf
from specdec.models.quant import DEFAULT_GROUP_SIZE
from specdec.stats import GenerationStats

SPECDEC_METHODS = ("none", "draft", "ngram", "medusa", "eagle")


class SpecdecRunner:
    def __init__(self, decoder: SpecDecoder, seed_mode: str = "rejection"):
        self.decoder = decoder
        self.speculative = decoder.speculative
        self.seed_mode = seed_mode

    def memory_mb(self) -> float:
        return self.decoder.memory_bytes() / 2**20

    def peak_rss_mb(self) -> float | None:
        return None  # shares the bench's process

    def run(self, prompt: str, temperature: float, max_new: int, seed: int) -> GenerationStats:
        # ignore_eos: every run produces exactly max_new tokens, so all methods do the same work
        return self.decoder.generate(prompt, temperature=temperature, max_new_tokens=max_new, seed=seed,
                                     seed_mode=self.seed_mode, ignore_eos=True).stats


def cost_model_bound(stats, plain_seconds_per_token: float) -> float | None:
    """Speedup the measured acceptance allows if a K-token verify cost one plain forward:
    tokens per step / (1 + K * draft_cost / target_cost)."""
    if not stats.target_forwards or not stats.drafted_tokens or plain_seconds_per_token <= 0:
        return None
    mean_k = stats.drafted_tokens / stats.target_forwards
    c = (stats.draft_seconds / stats.drafted_tokens) / plain_seconds_per_token
    return stats.mean_accepted_length / (1 + mean_k * c)


def default_methods(target: str | None, draft: str | None, llama_server: Path | None) -> list[str]:
    """Every method that can run on this target: drafters need a draft (--draft, or one shipped
    for the target); llama.cpp when a build is found."""
    if target is None or resolve_model_name(target).resolve() == DEFAULT_TARGET.resolve():
        methods = ["none", "draft", "ngram", "medusa", "eagle", "hf", "hf-assisted", "hf-lookup"]
    else:
        has_draft = bool(draft) or default_head(target, "draft") is not None
        methods = ["none", "ngram"] + (["draft"] if has_draft else [])
        methods += [m for m in ("medusa", "eagle") if default_head(target, m) is not None] + ["hf", "hf-lookup"]
        methods += ["hf-assisted"] if has_draft else []
    return methods + (["llama.cpp", "llama.cpp-ngram"] if llama_server else [])


def default_tasks(tokenizer: TextTokenizer) -> list[str]:
    """Instruction tasks for a model with a chat template (an instruct model), else raw text."""
    return ["code", "chat", "rewrite"] if tokenizer.config.get("chat_template") else list(RAW_TASKS)


def make_runner(m: str, setup: dict, stack: ExitStack, tokenizer: TextTokenizer):
    """The runner for bench method `m` ("draft:4" = draft with a fixed K of 4; "draft@seeded" =
    seeded drafter-invariant sampling instead of rejection sampling, the seeds being the bench's;
    "draft@tli" = a draft with another tokenizer through the shared tokens at T=0 too;
    "eagle@fast" = the fastest kernels instead of exact mode, for bfloat16/float16; "none@compile"
    = the layers compiled by inductor, fastest kernels)."""
    name, _, mode = m.partition("@")
    base, _, fixed = name.partition(":")
    if fixed and not fixed.isdigit():
        raise SpecdecError(f"bad method {m!r}: use NAME or NAME:K with an integer K")
    if mode not in ("", "seeded", "tli", "fast", "compile") or (mode and base not in SPECDEC_METHODS):
        raise SpecdecError(f"bad method {m!r}: only specdec methods take the suffixes @seeded, @fast and @compile "
                           "(draft: @tli)")
    if mode == "tli" and base != "draft":
        raise SpecdecError(f"bad method {m!r}: @tli is for method draft (a draft with another tokenizer)")
    target, draft, dtype = setup["target"], setup["draft"], setup["dtype"]
    if base in SPECDEC_METHODS:
        drafter = draft if base == "draft" else setup["heads"].get(base)  # medusa/eagle head folders
        return SpecdecRunner(load(target=target, draft=drafter, method=base, dtype=dtype,
                                  draft_tokens=int(fixed) if fixed else setup["draft_tokens"],
                                  quantize=setup.get("quantize"),
                                  group_size=setup.get("group_size", DEFAULT_GROUP_SIZE),
                                  cross_vocab="tli" if mode == "tli" else "auto",
                                  exact=False if mode in ("fast", "compile") else None,
                                  compile=mode == "compile",
                                  memory=False,  # a run must not depend on the runs before it
                                  reuse_prefix=False),  # every run pays for its prompt, as llama.cpp's
                             seed_mode="invariant" if mode == "seeded" else "rejection")
    if base in HF_METHODS and not fixed:
        draft_dir = draft or default_head(target, "draft")
        if m == "hf-assisted" and draft_dir is None:
            raise SpecdecError("hf-assisted needs a draft model (--draft; another tokenizer than the target's: "
                               "transformers' Universal Assisted Generation)")
        return TransformersPeer(m, target or DEFAULT_TARGET, draft_dir, tokenizer, dtype)
    if base in LLAMA_CPP_METHODS and not fixed:
        if setup["llama_server"] is None:
            raise SpecdecError(f"{m} needs a llama.cpp build: --llama-cpp DIR, ${ENV_VAR} or llama-server on PATH")
        if setup.get("llama_gguf") is None:  # written once, shared by every llama.cpp method
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="specdec-bench-")))
            setup["llama_gguf"] = llama_cpp_gguf(target or DEFAULT_TARGET, dtype, folder)
        ctx = min(8192, read_hf_config(target or DEFAULT_TARGET).get("max_position_embeddings", 4096))
        extra: tuple[str, ...] = ()
        if LLAMA_CPP_METHODS[base] == "draft":  # the same draft model as specdec's, when it is a GGUF
            draft_model = resolve_model_name(draft) if draft else default_head(target, "draft")
            if draft_model is None or find_gguf(Path(draft_model)) is None:
                raise SpecdecError(f"{m} needs a GGUF draft model (--draft FILE.gguf, or a target shipped with one)")
            extra = ("-md", str(find_gguf(Path(draft_model))), "--spec-draft-threads", str(torch.get_num_threads()))
        server = LlamaServer(setup["llama_server"], setup["llama_gguf"], torch.get_num_threads(), ctx,
                             LLAMA_CPP_METHODS[base], extra)
        return LlamaCppPeer(m, stack.enter_context(server), tokenizer)
    raise SpecdecError(f"unknown bench method {m!r}; choose from "
                       f"{', '.join(SPECDEC_METHODS + HF_METHODS + tuple(LLAMA_CPP_METHODS))} (NAME:K fixes K; "
                       "a specdec NAME@seeded uses seeded drafter-invariant sampling)")


def run_bench(methods: list[str], temperatures: list[float], tasks: list[str], target: str | None,
              draft: str | None, max_new_tokens: int, per_task: int, draft_tokens: int | None,
              dtype: str = "float32", heads: dict | None = None, repeats: int = 1, log=None,
              llama_server: Path | None = None, llama_gguf: Path | None = None, quantize: str | None = None,
              group_size: int = DEFAULT_GROUP_SIZE) -> list[Row]:
    """Every method on every prompt of `tasks` at each temperature; llama.cpp runs `llama_gguf`
    (default: the target rewritten as GGUF in `dtype`). Progress goes to `log` (default stderr,
    so that stdout holds the table alone)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    setup = dict(target=target, draft=draft, dtype=dtype, heads=heads or {}, draft_tokens=draft_tokens,
                 llama_server=llama_server, llama_gguf=llama_gguf, quantize=quantize, group_size=group_size)
    tokenizer = TextTokenizer(target or DEFAULT_TARGET)
    template = ChatTemplate.from_tokenizer_config(tokenizer.config)
    prompts = render_fim(render_chat(build_suite(per_task, tasks), template), tokenizer)
    with ExitStack() as stack:
        runners = {m: make_runner(m, setup, stack, tokenizer) for m in methods}
        for runner in runners.values():  # warm-up
            runner.run(prompts[0].text, 0.0, 8, 0)
        rows = []
        for task in tasks:
            for temp in temperatures:
                rows += measure_task([p.text for p in prompts if p.task == task], task, temp, runners,
                                     max_new_tokens, repeats, log)
    return rows


def measure_task(texts: list[str], task: str, temp: float, runners: dict, max_new_tokens: int, repeats: int,
                 log) -> list[Row]:
    # round robin over methods, prompt by prompt: drifts in machine speed hit all alike
    runs: dict[str, list] = {m: [] for m in runners}
    for i in range(repeats * len(texts)):
        for m, runner in runners.items():
            runs[m].append(runner.run(texts[i % len(texts)], temp, max_new_tokens, seed=i))
    rows, plain_tps, plain_decode = [], None, None
    for m, runner in runners.items():
        s = GenerationStats.merge(runs[m])
        memory, rss = (None if x is None else round(x, 1) for x in (runner.memory_mb(), runner.peak_rss_mb()))
        row = Row(m, task, temp, s.new_tokens, round(s.wall_seconds, 3), round(s.tokens_per_second, 2),
                  model_memory_mb=memory, peak_rss_mb=rss)
        if s.prefill_seconds > 0 and s.wall_seconds > s.prefill_seconds:
            row.decode_tokens_per_second = round(s.new_tokens / (s.wall_seconds - s.prefill_seconds), 2)
        if m == "none":
            plain_tps, plain_decode = s.tokens_per_second, row.decode_tokens_per_second
        if runner.speculative and s.target_forwards:  # transformers reports no per-step counts
            row.mean_accepted_length = round(s.new_tokens / s.target_forwards, 3)
            row.acceptance_rate = round(s.accepted_tokens / s.drafted_tokens, 3) if s.drafted_tokens else 0.0
            row.mean_draft_tokens = round(s.drafted_tokens / s.target_forwards, 2)
            if plain_tps and isinstance(runner, SpecdecRunner):
                bound = cost_model_bound(s, 1.0 / plain_tps)
                row.cost_model_bound = round(bound, 3) if bound else None
        rows.append(row)
        log(f"{task:9s} T={temp:<4} {m:16s} {row.tokens_per_second:8.1f} tok/s")
    for row in rows:
        row.speedup = round(row.tokens_per_second / plain_tps, 3) if plain_tps else None
        if plain_decode and row.decode_tokens_per_second:
            row.decode_speedup = round(row.decode_tokens_per_second / plain_decode, 3)
    return rows


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
    if any(m in HF_METHODS for m in methods):
        require("transformers", "bench", "the transformers peer (hf, hf-assisted, hf-lookup)")


def _names(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def cmd_bench(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.prompts < 1:
        raise SpecdecError("--repeats and --prompts must be >= 1")
    temps = _floats(args.temperatures)
    if any(t < 0 for t in temps):
        raise SpecdecError("temperatures must be >= 0")
    tasks = _names(args.tasks) or default_tasks(TextTokenizer(args.target or DEFAULT_TARGET))
    for t in tasks:
        if t not in TASKS:
            raise SpecdecError(f"unknown task {t!r}; choose from {', '.join(TASKS)}")
    llama_server = find_llama_server(args.llama_cpp)
    methods = _names(args.methods) or default_methods(args.target, args.draft, llama_server)
    llama_gguf = Path(args.llama_cpp_gguf) if args.llama_cpp_gguf else None
    if llama_gguf is not None and not llama_gguf.is_file():
        raise SpecdecError(f"--llama-cpp-gguf {str(llama_gguf)!r} is not a file")
    check_extras(methods, args.plot)
    apply_threads(args)
    args.quantize = args.quantize or default_quantize(args.target)
    if llama_gguf is None and args.quantize == "gguf":  # llama.cpp runs the very file specdec runs on its blocks
        llama_gguf = find_gguf(resolve_model_name(args.target or DEFAULT_TARGET))
    rows = run_bench(methods, temps, tasks, args.target, args.draft, args.max_new_tokens, args.prompts,
                     args.draft_tokens, args.dtype, {"medusa": args.medusa, "eagle": args.eagle},
                     args.repeats, llama_server=llama_server, llama_gguf=llama_gguf, quantize=args.quantize,
                     group_size=args.group_size)
    print_table(rows)
    curves = (pass_cost_curves(args.target or DEFAULT_TARGET, args.dtype, args.quantize, args.group_size,
                               llama_server, llama_gguf, compiled=any(m.endswith("@compile") for m in methods))
              if args.pass_costs else [])
    if curves:
        print_cost_table(curves)
    if args.json:
        llama_cpp = None
        if any(m.partition(":")[0] in LLAMA_CPP_METHODS for m in methods):
            llama_cpp = {"server": str(llama_server), "version": server_version(llama_server),
                         "gguf": str(llama_gguf) if llama_gguf else f"target written as GGUF in {args.dtype}"}
        Path(args.json).write_text(json.dumps({"target": args.target or DEFAULT_TARGET.name,
                                               "threads": torch.get_num_threads(), "dtype": args.dtype,
                                               "quantize": args.quantize,
                                               "max_new_tokens": args.max_new_tokens,
                                               "prompts_per_task": args.prompts, "repeats": args.repeats,
                                               "llama_cpp": llama_cpp, "rows": [asdict(r) for r in rows],
                                               "pass_costs": [asdict(c) for c in curves]},
                                              indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 0


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark methods side by side (speedup vs none)")
    b.add_argument("--methods", help="comma-separated (default: every method this target can run, incl. "
                                     "the transformers peer and llama.cpp when found). NAME:K fixes K; "
                                     "NAME@seeded samples with seeded drafter-invariant sampling (the "
                                     "default: rejection sampling)")
    b.add_argument("--temperatures", default="0,0.7,1.0")
    b.add_argument("--tasks", help=f"comma-separated from {', '.join(TASKS)} (default: code,chat,rewrite "
                                   "for a model with a chat template, else code,edit,freetext)")
    add_checkpoint_args(b, draft_help="draft model for draft and hf-assisted (default: the bundled one "
                                      "for the bundled target)")
    b.add_argument("--medusa", help="Medusa heads folder (default: bundled, for the bundled target)")
    b.add_argument("--eagle", help="EAGLE head folder (default: the one shipped for the target: bundled pair, smollm2)")
    b.add_argument("--llama-cpp", metavar="DIR", help=f"llama.cpp build folder holding llama-server "
                                                      f"(default: ${ENV_VAR}, else llama-server on PATH)")
    b.add_argument("--llama-cpp-gguf", metavar="FILE", help="GGUF for the llama.cpp methods (default: the "
                                                            "target written as GGUF in --dtype: the same weights)")
    add_quantize_args(b)
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--prompts", type=int, default=3, help="prompts per task")
    b.add_argument("--repeats", type=int, default=1, help="passes over the prompts (methods take turns)")
    b.add_argument("--draft-tokens", type=int, default=None, help="fixed K (default adaptive)")
    add_threads_arg(b)
    b.add_argument("--pass-costs", action="store_true",
                   help="also time target passes over 1/2/4/8/16/32 tokens (specdec, and llama.cpp's llama-bench on "
                        "the same GGUF when a build is found; with NAME@compile methods, specdec --compile too) "
                        "against this machine's memory-bandwidth bound")
    b.add_argument("--json")
    b.add_argument("--plot")
    b.set_defaults(func=cmd_bench)
