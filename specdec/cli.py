"""Command-line interface: generate, models, bench, verify, train, serve."""
from __future__ import annotations

import argparse
import json
import sys

from specdec.errors import SpecdecError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"specdec: error: {message}\n")
        raise SystemExit(2)


def _add_model_args(p: argparse.ArgumentParser, methods: tuple[str, ...]) -> None:
    p.add_argument("--target", help="target model folder (HF layout); default: bundled pycode-target")
    p.add_argument("--draft", help="draft model folder (method draft) or Medusa/EAGLE head folder; "
                                   "default: the bundled one for the bundled target")
    p.add_argument("--method", default="none", choices=methods)
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | float64")
    p.add_argument("--backend", default="auto", choices=("auto", "native", "transformers"))
    p.add_argument("--draft-tokens", type=int, default=None,
                   help="fixed number of drafted tokens per step (default: adaptive)")
    p.add_argument("--max-draft-tokens", type=int, default=8, help="upper bound for adaptive K")
    p.add_argument("--tree-nodes", type=int, default=None, help="largest draft tree (medusa, eagle)")
    p.add_argument("--typical-acceptance", action="store_true",
                   help="LOSSY: Medusa's typical acceptance for tree methods at T > 0; the output no longer "
                        "follows the target's distribution (off by default)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                max_new_tokens=args.max_new_tokens, seed=args.seed, stop=tuple(args.stop))


def _load(args):
    import specdec

    return specdec.load(target=args.target, draft=args.draft, method=args.method, dtype=args.dtype,
                        backend=args.backend, draft_tokens=args.draft_tokens,
                        max_draft_tokens=args.max_draft_tokens, tree_nodes=args.tree_nodes,
                        typical_acceptance=args.typical_acceptance)


def _stats_line(stats) -> str:
    parts = [f"method={stats.method}" + (" (LOSSY: typical acceptance)" if stats.lossy else ""), f"new_tokens={stats.new_tokens}",
             f"target_forwards={stats.target_forwards}", f"tokens/s={stats.tokens_per_second:.1f}"]
    if stats.speculative:
        parts += [f"drafted={stats.drafted_tokens}", f"accepted={stats.accepted_tokens}",
                  f"acceptance={stats.acceptance_rate:.2f}",
                  f"mean_accepted_length={stats.mean_accepted_length:.2f}"]
    return "[" + " ".join(parts) + "]"


def cmd_generate(args) -> int:
    from specdec.engine import GenerationStats

    if args.n < 1:
        raise SpecdecError(f"--n must be >= 1, got {args.n}")
    decoder = _load(args)
    sampling = _sampling(args)
    decoder.sampling_params(**sampling)  # validate before any output
    results = []
    for i in range(args.n):
        seed = None if args.seed is None else args.seed + i
        if args.json:
            results.append(decoder.generate(args.prompt, **{**sampling, "seed": seed}))
            continue
        if args.n > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(args.prompt)
        for chunk in decoder.stream(args.prompt, **{**sampling, "seed": seed}):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.result is not None:
                results.append(chunk.result)
        sys.stdout.write("\n")
    stats = GenerationStats.merge([r.stats for r in results])
    if args.json:
        keys = ("method", "lossy", "new_tokens", "target_forwards", "drafted_tokens", "accepted_tokens",
                "acceptance_rate", "mean_accepted_length", "tokens_per_second", "wall_seconds",
                "accepted_length_histogram", "draft_seconds", "target_seconds", "other_seconds",
                "prefill_seconds")
        d = stats.to_dict()
        out = {"samples": [{"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason}
                           for r in results],
               "stats": {k: d[k] for k in keys}}
        print(json.dumps(out))
    else:
        print(_stats_line(stats), file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    from specdec.bundled import bundled_models
    from specdec.models.checkpoint import read_hf_config

    models = bundled_models()
    if not models:
        print("no bundled models found")
        return 1
    for path in models:
        cfg = read_hf_config(path)
        if str(cfg.get("model_type", "")).startswith("specdec-"):
            print(f"{path.name}\t{cfg['model_type']}\tdraft heads for {cfg.get('target')}\t{path}")
            continue
        print(f"{path.name}\t{cfg.get('model_type')}\tlayers={cfg.get('num_hidden_layers')} "
              f"hidden={cfg.get('hidden_size')} vocab={cfg.get('vocab_size')}\t{path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from specdec.api import METHODS

    parser = _Parser(prog="specdec", description="Lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt")
    _add_model_args(g, METHODS)
    _add_sampling_args(g)
    g.add_argument("--n", type=int, default=1, help="number of independent samples")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list bundled models")
    m.set_defaults(func=cmd_models)

    from specdec import bench, certify
    from specdec.train import cli as train_cli

    bench.add_parser(sub)
    certify.add_parser(sub)
    train_cli.add_parser(sub)
    try:
        from specdec.server import cli as server_cli
    except ImportError:
        server_cli = None
    if server_cli is not None:
        server_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
