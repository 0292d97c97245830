"""`specdec verify`: a losslessness check users can run on their own models. It samples short
continuations with a speculative method and with plain decoding and compares the two
samples with a chi-square test of homogeneity. At temperature 0 it compares greedy outputs on
up to 20 prompts token for token: identical in every dtype in exact mode (batch-invariant
passes; the default for bfloat16/float16, --exact for any dtype); with --no-exact it measures
how often rounding that depends on the pass width makes the outputs diverge. With
--seed-mode invariant (T > 0) it compares seeded outputs token for token in the same way:
seed i must give the same tokens with and without speculation."""
from __future__ import annotations

import argparse
import json
from collections import Counter

from specdec.cli.common import add_distribution_args, add_model_args, add_seed_mode_arg, distribution, load_decoder
from specdec.data.prompts import build_suite
from specdec.engine.config import METHODS
from specdec.engine.decoder import SpecDecoder
from specdec.errors import SpecdecError
from specdec.extras import require


def homogeneity_p_value(a: Counter, b: Counter, min_expected: float = 5.0) -> float:
    """Chi-square two-sample test on outcome counts; rare outcomes are pooled."""
    chi2_contingency = require("scipy.stats", "bench", "the chi-square test").chi2_contingency
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    rows_a, rows_b, pool_a, pool_b = [], [], 0, 0
    for k in keys:
        total = a[k] + b[k]
        if total * min(na, nb) / (na + nb) >= min_expected:
            rows_a.append(a[k]), rows_b.append(b[k])
        else:
            pool_a += a[k]
            pool_b += b[k]
    if pool_a + pool_b:
        rows_a.append(pool_a), rows_b.append(pool_b)
    if len(rows_a) < 2:
        return 1.0
    return float(chi2_contingency([rows_a, rows_b]).pvalue)


def output_identity(decoder_spec: SpecDecoder, decoder_plain: SpecDecoder, prompts: list[str], tokens: int,
                    sampling: dict | None = None) -> dict:
    """How many prompts give token-for-token the same output with and without speculation:
    greedy, or seeded drafter-invariant sampling with seed i for prompt i."""
    sampling = dict(sampling or {})
    seeded = sampling.get("temperature", 0.0) > 0.0
    kind = "seeded" if seeded else "greedy"
    diverged = []
    for i, prompt in enumerate(prompts):
        options = dict(sampling, seed=i) if seeded else sampling
        a = decoder_spec.generate(prompt, max_new_tokens=tokens, **options).token_ids
        b = decoder_plain.generate(prompt, max_new_tokens=tokens, **options).token_ids
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"prompt": i, "first_difference_at": first})
    same = len(prompts) - len(diverged)
    return {"test": f"{kind} identity", "p_value": None, "prompts": len(prompts), "identical": same,
            "diverged": diverged,
            "verdict": f"LOSSLESS: identical {kind} output on {same}/{len(prompts)} prompts" if not diverged
            else f"DIFFERENT {kind} output on {len(diverged)}/{len(prompts)} prompts"}


def check_lossless(decoder_spec: SpecDecoder, decoder_plain: SpecDecoder, prompt: str, samples: int,
                   tokens: int, sampling: dict) -> dict:
    """Greedy identity at temperature 0 (the prompt plus suite prompts, up to `samples` in all),
    else a chi-square test between `samples` sampled continuations of each decoder."""
    if samples < 1 or tokens < 1:
        raise SpecdecError("--samples and --tokens must be >= 1")
    if sampling.get("temperature", 0.0) == 0.0 or sampling.get("seed_mode") == "invariant":
        prompts = [prompt] + [p.text for p in build_suite(7)][:max(0, min(samples, 20) - 1)]
        return output_identity(decoder_spec, decoder_plain, prompts, tokens, sampling)
    require("scipy.stats", "bench", "the chi-square test")  # fail before sampling, not after
    spec, plain = Counter(), Counter()
    drafted = accepted = 0
    for i in range(samples):
        result = decoder_spec.generate(prompt, max_new_tokens=tokens, seed=i, **sampling)
        spec[tuple(result.token_ids)] += 1
        drafted += result.stats.drafted_tokens
        accepted += result.stats.accepted_tokens
        plain[tuple(decoder_plain.generate(prompt, max_new_tokens=tokens, seed=samples + i,
                                           **sampling).token_ids)] += 1
    p = homogeneity_p_value(spec, plain)
    if drafted == 0:  # every step was a plain step: the samples say nothing about the verifier
        verdict = ("INCONCLUSIVE: the method drafted no tokens for this prompt (for ngram, use a prompt "
                   "that repeats itself)")
    elif p > 0.01:
        verdict = "consistent with lossless: no difference detected"
    else:
        verdict = "DIFFERENT: the method's samples do not follow the target's distribution"
    return {"test": "chi-square homogeneity", "p_value": p, "distinct_outcomes": len(set(spec) | set(plain)),
            "drafted_tokens": drafted, "accepted_tokens": accepted, "verdict": verdict}


def cmd_verify(args: argparse.Namespace) -> int:
    sampling = dict(distribution(args), seed_mode=args.seed_mode)
    if args.draft_tokens < 1:
        raise SpecdecError(f"--draft-tokens must be >= 1, got {args.draft_tokens}")
    identity = args.temperature == 0.0 or args.seed_mode == "invariant"
    if identity and args.tokens is None:
        args.tokens = 64
    elif args.tokens is None:
        args.tokens = 2
    # a fixed K: every step speculates, so the verifier is exercised on every sample
    spec = load_decoder(args)
    plain = load_decoder(args, method="none", draft=None, draft_tokens=None, typical_acceptance=False)
    report = check_lossless(spec, plain, args.prompt, args.samples, args.tokens, sampling)
    report.update(method=args.method, samples_per_method=args.samples, tokens=args.tokens, dtype=args.dtype,
                  exact=spec.exact, **sampling)
    if args.json:
        print(json.dumps(report))
    else:
        p = "" if report["p_value"] is None else f" p-value={report['p_value']:.4g}"
        mode = "exact" if spec.exact else "fast (--no-exact)"
        print(f"{args.method} vs none, {args.samples} samples x {args.tokens} tokens at "
              f"T={args.temperature}, {args.dtype}, {mode} kernels:{p}\nverdict: {report['verdict']}")
    return 0 if report["verdict"].startswith(("LOSSLESS", "consistent")) else 1


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="check that a method reproduces plain decoding's distribution")
    add_model_args(v, methods=tuple(m for m in METHODS if m != "none"), method_default=None,
                   draft_tokens_default=4)
    add_distribution_args(v, temperature=1.0)
    add_seed_mode_arg(v, default="rejection")
    v.add_argument("--prompt", default="def ")
    v.add_argument("--samples", type=int, default=2000,
                   help="samples per method (T > 0); at T = 0 or --seed-mode invariant, prompts compared "
                        "(at most 20)")
    v.add_argument("--tokens", type=int, default=None,
                   help="tokens per sample (default 2; 64 at T = 0 or --seed-mode invariant)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)
