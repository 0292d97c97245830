"""Command-line interface: generate, chat, models, bench, bench-serve, verify, train, serve, convert. Each subcommand
module registers itself here with an add_parser(sub) call; shared options live in
specdec.cli.common."""
from __future__ import annotations

import argparse
import json
import sys

from specdec.cli.common import add_model_args, add_sampling_args, load_decoder, sampling, stats_line
from specdec.errors import SpecdecError
from specdec.stats import GenerationStats

# stats keys of `specdec generate --json`
JSON_STATS = ("method", "lossy", "new_tokens", "target_forwards", "drafted_tokens", "accepted_tokens",
              "acceptance_rate", "mean_accepted_length", "tokens_per_second", "wall_seconds",
              "accepted_length_histogram", "draft_seconds", "target_seconds", "other_seconds", "prefill_seconds")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"specdec: error: {message}\n")
        raise SystemExit(2)


def cmd_generate(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise SpecdecError(f"--n must be >= 1, got {args.n}")
    if args.logprobs is not None and not args.json:
        raise SpecdecError("--logprobs is reported in the JSON output: add --json")
    decoder = load_decoder(args)
    options = dict(sampling(args), logprobs=args.logprobs)
    prompt = args.prompt
    if args.suffix is not None:  # the prompt is the text before the gap
        fim = decoder.fim_prompt(args.prompt, args.suffix, max_new_tokens=options["max_new_tokens"])
        prompt, options["stop_token_ids"] = fim.ids, fim.stop_token_ids
    decoder.sampling_params(**options)  # validate before any output
    results = []
    for i in range(args.n):
        seed = None if args.seed is None else args.seed + i
        if args.json:
            results.append(decoder.generate(prompt, **{**options, "seed": seed}))
            continue
        if args.n > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(args.prompt)
        for chunk in decoder.stream(prompt, **{**options, "seed": seed}):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.result is not None:
                results.append(chunk.result)
        sys.stdout.write(f"{args.suffix or ''}\n")
    stats = GenerationStats.merge([r.stats for r in results])
    if args.json:
        d = stats.to_dict()
        out = {"samples": [sample_json(decoder, r) for r in results], "stats": {k: d[k] for k in JSON_STATS}}
        print(json.dumps(out))
    else:
        print(stats_line(stats), file=sys.stderr)
    return 0


def sample_json(decoder, result) -> dict:
    """One sample of `generate --json`; with --logprobs, each token's logprob (the target
    model's raw distribution) and its most likely alternatives."""
    out = {"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason}
    if result.token_logprobs is not None:
        from specdec.sampling.logprobs import token_texts

        texts = token_texts(decoder.tokenizer)
        out["logprobs"] = [{"token_id": e.token, "token": texts.text(e.token), "logprob": e.logprob,
                            "top_logprobs": [{"token_id": t, "token": texts.text(t), "logprob": lp} for t, lp in e.top]}
                           for e in result.token_logprobs]
    return out


def cmd_models(args: argparse.Namespace) -> int:
    from specdec.models.bundled import bundled_models, packaged_model_lines, resolve_model_name
    from specdec.models.checkpoint import read_hf_config

    if args.path:
        path = resolve_model_name(args.path)
        if not path.exists():
            raise SpecdecError(f"no model named {args.path!r}; `specdec models` lists them")
        print(path.resolve())
        return 0
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
    for line in packaged_model_lines():  # pretrained models installed as packages (smollm2)
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from specdec.bench import methods as bench
    from specdec.bench import serve as bench_serve
    from specdec.cli import chat as chat_cli
    from specdec.cli import convert, lossless_check
    from specdec.cli import serve as server_cli
    from specdec.train import cli as train_cli

    parser = _Parser(prog="specdec", description="Lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt")
    g.add_argument("--suffix", metavar="TEXT", default=None,
                   help="fill in the middle: the prompt is the text before the gap, TEXT the text after it "
                        "(a code model with FIM tokens, such as qwen-coder)")
    add_model_args(g)
    add_sampling_args(g)
    g.add_argument("--n", type=int, default=1, help="number of independent samples")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's log-probability under the target model and its N most "
                        "likely alternatives (0-20)")
    g.set_defaults(func=cmd_generate)

    chat_cli.add_parser(sub)

    m = sub.add_parser("models", help="list bundled and packaged models")
    m.add_argument("--path", metavar="NAME", help="print the file or folder a model name stands for (assembling a "
                                                  "split model such as qwen-coder first)")
    m.set_defaults(func=cmd_models)

    bench.add_parser(sub)
    bench_serve.add_parser(sub)
    lossless_check.add_parser(sub)
    train_cli.add_parser(sub)
    server_cli.add_parser(sub)  # the web packages are imported only when `serve` runs
    convert.add_parser(sub)
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
