"""`specdec bench-serve`: many users at once. C concurrent streaming clients (for each C of
--concurrency) send a fixed prompt set (specdec.data.prompts) with fixed output lengths to
OpenAI-compatible servers, and the report gives, per server and C, aggregate tokens/s,
requests/s, time to first token and per-token latency (p50/p99) and errors (serve_load.py
measures). Servers are named by --url, or started here one at a time on the same weights so
that one run compares them: `specdec serve` per --specdec-methods (with --max-batch), and
llama.cpp's llama-server per --llama-configs (with --parallel slots, continuous batching on,
prompt caching off as specdec has none)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from specdec.bench.llama_cpp import ENV_VAR, SPEC_ARGS, LlamaServer, find_llama_server, server_version
from specdec.bench.serve_load import APIS, Endpoint, LevelReport, LoadSpec, run_level, served_model
from specdec.bench.serve_report import format_table, plot
from specdec.bench.servers import STARTUP_SECONDS, SpecdecServer, Target
from specdec.cli.common import check_at_least
from specdec.data.prompts import CHAT_TASKS, TASKS, build_suite, render_chat, render_fim
from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.models.bundled import DEFAULT_TARGET

# llama.cpp configurations: llama_cpp.SPEC_ARGS, and a draft model (--draft or --llama-draft-gguf)
LLAMA_CONFIGS = (*SPEC_ARGS, "draft")
API_KEY_ENV = "OPENAI_API_KEY"
# A level's wall time ends with a ramp-down, while the last requests run beside fewer than C
# others; with speculation requests differ in speed (prompt lookup finds code, not prose), so
# the ramp-down grows. Measured here (SmolLM2 bf16, ngram, C=4): see bench/results/README.md, stop 26.
REQUESTS_PER_CLIENT = 4


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdecError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise SpecdecError(f"{flag} must list integers >= 1, got {text!r}")
    return values


def _names(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def check_args(args: argparse.Namespace) -> None:
    args.concurrency_levels = _ints(args.concurrency, "--concurrency")
    check_at_least(args.max_tokens, "--max-tokens", 1)
    check_at_least(args.temperature, "--temperature", 0)
    if args.requests is not None:
        check_at_least(args.requests, "--requests", 1)
    check_at_least(args.prompts, "--prompts", 1)
    check_at_least(args.warmup, "--warmup", 0)
    check_at_least(args.timeout, "--timeout", 0, strict=True)
    for t in _names(args.tasks):
        if t not in TASKS:
            raise SpecdecError(f"unknown task {t!r}; choose from {', '.join(TASKS)}")
    for m in _names(args.specdec_methods):
        if m not in ("none", "ngram", "draft", "medusa", "eagle"):
            raise SpecdecError(f"unknown specdec method {m!r} in --specdec-methods")
    for c in _names(args.llama_configs):
        if c not in LLAMA_CONFIGS:
            raise SpecdecError(f"unknown llama.cpp configuration {c!r}; choose from {', '.join(LLAMA_CONFIGS)}")
    if "draft" in _names(args.llama_configs) and not (args.draft or args.llama_draft_gguf):
        raise SpecdecError("--llama-configs draft needs a draft model: --draft or --llama-draft-gguf")
    if args.max_batch < 1 or (args.llama_parallel is not None and args.llama_parallel < 1):
        raise SpecdecError("--max-batch and --llama-parallel must be >= 1")
    if args.llama_ctx_per_slot < 16:
        raise SpecdecError(f"--llama-ctx-per-slot must be >= 16, got {args.llama_ctx_per_slot}")
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except ValueError as e:
            raise SpecdecError(f"--extra-body is not JSON: {e}") from None
        if not isinstance(extra, dict):
            raise SpecdecError("--extra-body must be a JSON object")
    if not (args.url or _names(args.specdec_methods) or _names(args.llama_configs)):
        raise SpecdecError("nothing to measure: give --url, --specdec-methods or --llama-configs")
    for flag, path in (("--llama-cpp-gguf", args.llama_cpp_gguf), ("--llama-draft-gguf", args.llama_draft_gguf)):
        if path and not Path(path).is_file():
            raise SpecdecError(f"{flag} {path!r} is not a file")


def load_prompts(args: argparse.Namespace) -> list:
    """--prompt texts, else the suite's prompts: text for completions (chat tasks rendered in
    --target's chat template), messages for chat."""
    if args.prompt:
        return list(args.prompt)
    tasks = _names(args.tasks) or ["code", "chat"]
    suite = build_suite(args.prompts, tasks)
    if args.api == "chat":
        return [p.messages or [{"role": "user", "content": p.text}] for p in suite]
    if any(t in CHAT_TASKS or t == "fim" for t in tasks):
        from specdec.chat.template import ChatTemplate
        from specdec.engine.text import TextTokenizer

        tokenizer = TextTokenizer(args.target or DEFAULT_TARGET)
        suite = render_fim(render_chat(suite, ChatTemplate.from_tokenizer_config(tokenizer.config)), tokenizer)
    return [p.text for p in suite]


def build_targets(args: argparse.Namespace, shared: ExitStack) -> list[Target]:
    """The servers to measure; `shared` holds what outlives one server (the GGUF written for
    llama.cpp)."""
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    extra = json.loads(args.extra_body) if args.extra_body else {}
    targets = [Target(url if len(args.url) == 1 else f"url{i + 1}", url, args.model, api_key, extra)
               for i, url in enumerate(args.url or [])]
    if len(targets) == 1:
        targets[0].name = "server"
    model_args = ["--target", args.target] if args.target else []
    model_args += ["--dtype", args.dtype] + (["--draft", args.draft] if args.draft else [])
    model_args += ["--threads", str(args.threads)] if args.threads else []
    for m in _names(args.specdec_methods):
        serve_args = [*model_args, "--method", m, "--max-batch", str(args.max_batch), "--model-name", f"specdec-{m}",
                      "--max-queue", str(max(64, 2 * max(args.concurrency_levels))),
                      *(["--max-len", str(args.max_len)] if args.max_len else []), *shlex.split(args.serve_args or "")]
        targets.append(Target(f"specdec-{m} b{args.max_batch}", model=f"specdec-{m}", extra_body=dict(extra),
                              start=lambda stack, a=serve_args: stack.enter_context(SpecdecServer(a)).url,
                              command=["specdec", "serve", *serve_args]))
    configs = _names(args.llama_configs)
    if configs:
        binary = find_llama_server(args.llama_cpp)
        if binary is None:
            raise SpecdecError(f"--llama-configs needs llama.cpp's llama-server: --llama-cpp DIR, ${ENV_VAR} "
                               "or llama-server on PATH")
        parallel = args.llama_parallel or max(args.concurrency_levels)
        gguf: dict = {}

        def written(key: str, given: str | None, model: str) -> Path:
            """A GGUF of `model` in --dtype, written once and shared by every configuration."""
            if key not in gguf:
                if given:
                    gguf[key] = Path(given)
                else:
                    from specdec.bench.peers import llama_cpp_gguf

                    folder = Path(shared.enter_context(tempfile.TemporaryDirectory(prefix="specdec-bench-serve-")))
                    gguf[key] = llama_cpp_gguf(model, args.dtype, folder)
            return gguf[key]

        def start_llama(stack, config):
            model = written("target", args.llama_cpp_gguf, args.target or DEFAULT_TARGET)
            extra = ("--cont-batching",)
            if config == "draft":
                draft = written("draft", args.llama_draft_gguf, args.draft)
                extra += ("--spec-type", "draft-simple", "-md", str(draft))
            server = LlamaServer(binary, model, args.threads or os.cpu_count() or 1, parallel * args.llama_ctx_per_slot,
                                 "none" if config == "draft" else config, startup_seconds=STARTUP_SECONDS,
                                 parallel=parallel, extra_args=extra)
            return f"http://127.0.0.1:{stack.enter_context(server).port}"

        for config in configs:
            name = f"llama.cpp{'' if config == 'none' else '-' + config} np{parallel}"
            # cache_prompt off: every request pays for its prompt, as on specdec's server; top_k and
            # min_p off: llama.cpp's default chain would filter sampled tokens (T > 0)
            body = {**extra, "cache_prompt": False, "top_k": 0, "min_p": 0.0}
            spec = ["--spec-type", "draft-simple", "-md", "DRAFT"] if config == "draft" else SPEC_ARGS[config]
            targets.append(Target(name, extra_body=body, start=lambda stack, c=config: start_llama(stack, c),
                                  command=["llama-server", "-np", str(parallel), *spec]))
    return targets


# ---------------------------------------------------------------- running

def measure(target: Target, prompts: list, spec: LoadSpec, args: argparse.Namespace, log) -> list[LevelReport]:
    endpoint = Endpoint(target.url, target.model or served_model(target.url, target.api_key), target.api_key,
                        args.api, target.extra_body)
    target.model = endpoint.model
    if args.warmup:
        warm, _ = run_level(endpoint, prompts, LoadSpec(min(spec.max_tokens, 16), spec.temperature, spec.ignore_eos,
                                                        spec.timeout), 1, args.warmup, target.name)
        if warm.errors:
            log(f"  warm-up failed: {warm.error_samples[0]}")
    reports = []
    for c in args.concurrency_levels:
        n = args.requests or max(REQUESTS_PER_CLIENT * c, len(prompts))
        report, _ = run_level(endpoint, prompts, spec, c, n, target.name)
        log(f"  {target.name} C={c}: {report.tokens_per_second:.1f} tok/s, {report.completed}/{report.requests} ok")
        reports.append(report)
    return reports


def run(args: argparse.Namespace, log=None) -> tuple[list[LevelReport], list[Target]]:
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    prompts = load_prompts(args)
    spec = LoadSpec(args.max_tokens, args.temperature, not args.no_ignore_eos, args.timeout)
    reports = []
    with ExitStack() as shared:
        targets = build_targets(args, shared)
        for target in targets:  # one server at a time: they would share the CPU
            with ExitStack() as stack:
                if target.start is not None:
                    log(f"starting {target.name} ...")
                    target.url = target.start(stack)
                reports += measure(target, prompts, spec, args, log)
    return reports, targets


def cmd_bench_serve(args: argparse.Namespace) -> int:
    require("httpx", "bench", "specdec bench-serve")
    check_args(args)
    if args.plot:
        require("matplotlib", "bench", "--plot")
    reports, targets = run(args)
    print(format_table(reports))
    if args.json:
        config = {k: getattr(args, k) for k in ("api", "max_tokens", "temperature", "requests", "warmup", "tasks",
                                                 "prompts", "target", "dtype", "max_batch", "threads")}
        config.update(concurrency=args.concurrency_levels, ignore_eos=not args.no_ignore_eos)
        llama = None
        if _names(args.llama_configs):
            binary = find_llama_server(args.llama_cpp)
            llama = {"server": str(binary), "version": server_version(binary), "gguf": args.llama_cpp_gguf
                     or f"target written as GGUF in {args.dtype}", "draft_gguf": args.llama_draft_gguf or args.draft}
        out = {"config": config, "llama_cpp": llama,
               "targets": [{"name": t.name, "url": t.url, "model": t.model, "command": t.command} for t in targets],
               "levels": [asdict(r) for r in reports]}
        Path(args.json).write_text(json.dumps(out, indent=2))
    if args.plot:
        plot(reports, args.plot)
    return 1 if any(r.errors for r in reports) and args.fail_on_error else 0


def add_parser(sub) -> None:
    b = sub.add_parser("bench-serve", help="load-test OpenAI-compatible servers with concurrent streaming "
                                           "clients (specdec serve, llama-server, any URL)")
    b.add_argument("--url", action="append", help="a running server's base URL (repeatable)")
    b.add_argument("--model", help="model id for --url servers (default: the first on /v1/models)")
    b.add_argument("--api-key", help=f"bearer key for --url servers (default: ${API_KEY_ENV})")
    b.add_argument("--api", choices=APIS, default="completions",
                   help="completions (text prompts; chat tasks rendered in --target's template) or chat (messages)")
    b.add_argument("--concurrency", default="1,4,16,32", help="comma-separated client counts (default 1,4,16,32)")
    b.add_argument("--requests", type=int, default=None,
                   help=f"requests per level (default: max({REQUESTS_PER_CLIENT} x clients, number of prompts))")
    b.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    b.add_argument("--no-ignore-eos", action="store_true",
                   help="let requests stop at EOS (default: ignore_eos, so every request makes --max-tokens)")
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--tasks", help=f"prompt suite tasks, from {', '.join(TASKS)} (default code,chat)")
    b.add_argument("--prompts", type=int, default=3, help="prompts per task (default 3)")
    b.add_argument("--prompt", action="append", help="a prompt of your own (repeatable; replaces the suite)")
    b.add_argument("--warmup", type=int, default=1, help="short requests sent to each server first (default 1)")
    b.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    b.add_argument("--extra-body", help="JSON object merged into every request body")
    g = b.add_argument_group("servers started here (one at a time, on the same weights)")
    g.add_argument("--target", help="model for started servers and the chat template (default: bundled target)")
    g.add_argument("--draft", help="draft model (specdec method draft)")
    g.add_argument("--dtype", default="float32", help="dtype of specdec's servers and of the GGUF written "
                                                      "for llama.cpp (default float32)")
    g.add_argument("--threads", type=int, default=0, help="threads of each started server (default: their own)")
    g.add_argument("--specdec-methods", help="start `specdec serve` for each of these methods (e.g. none,ngram)")
    g.add_argument("--max-batch", type=int, default=16, help="specdec serve --max-batch (default 16)")
    g.add_argument("--max-len", type=int, default=None, help="specdec serve --max-len (bounds its batch KV cache)")
    g.add_argument("--serve-args", help="more `specdec serve` arguments, one string (e.g. '--quantize int8')")
    g.add_argument("--llama-configs", help=f"start llama-server for each of these: {', '.join(LLAMA_CONFIGS)} "
                                           "(draft: --draft as the draft model)")
    g.add_argument("--llama-cpp", metavar="DIR", help=f"llama.cpp build folder (default: ${ENV_VAR}, else PATH)")
    g.add_argument("--llama-cpp-gguf", metavar="FILE", help="GGUF for llama-server (default: --target written "
                                                            "as GGUF in --dtype: the same weights)")
    g.add_argument("--llama-draft-gguf", metavar="FILE", help="draft GGUF for --llama-configs draft (default: "
                                                              "--draft written as GGUF in --dtype)")
    g.add_argument("--llama-parallel", type=int, default=None,
                   help="llama-server --parallel slots (default: the largest --concurrency)")
    g.add_argument("--llama-ctx-per-slot", type=int, default=2048, help="context per llama-server slot (default 2048)")
    b.add_argument("--json", help="write the report as JSON")
    b.add_argument("--plot", help="write a plot (tokens/s, TTFT, ITL against clients)")
    b.add_argument("--fail-on-error", action="store_true", help="exit 1 when any request failed")
    b.set_defaults(func=cmd_bench_serve)
