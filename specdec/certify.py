"""`specdec verify`: a losslessness check users can run on their own models. It samples short
continuations with a speculative method and with plain decoding and compares the two
samples with a chi-square test of homogeneity. At temperature 0 it compares greedy outputs on
up to 20 prompts token for token (in float64 for exact identity; in float32 it measures how
often rounding makes the outputs diverge)."""
from __future__ import annotations

from collections import Counter

from specdec.errors import SpecdecError


def homogeneity_p_value(a: Counter, b: Counter, min_expected: float = 5.0) -> float:
    """Chi-square two-sample test on outcome counts; rare outcomes are pooled."""
    from scipy.stats import chi2_contingency

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


def greedy_identity(decoder_spec, decoder_plain, prompts: list[str], tokens: int) -> dict:
    """How many prompts give token-for-token the same greedy output with and without speculation."""
    diverged = []
    for i, prompt in enumerate(prompts):
        a = decoder_spec.generate(prompt, max_new_tokens=tokens).token_ids
        b = decoder_plain.generate(prompt, max_new_tokens=tokens).token_ids
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"prompt": i, "first_difference_at": first})
    same = len(prompts) - len(diverged)
    return {"test": "greedy identity", "p_value": None, "prompts": len(prompts), "identical": same,
            "diverged": diverged,
            "verdict": f"LOSSLESS: identical greedy output on {same}/{len(prompts)} prompts" if not diverged
            else f"DIFFERENT greedy output on {len(diverged)}/{len(prompts)} prompts"}


def certify(decoder_spec, decoder_plain, prompt: str, samples: int, tokens: int, sampling: dict) -> dict:
    if samples < 1 or tokens < 1:
        raise SpecdecError("--samples and --tokens must be >= 1")
    if sampling.get("temperature", 0.0) == 0.0:
        from specdec.bench import build_suite

        prompts = [prompt] + [p.text for p in build_suite(7)][:max(0, min(samples, 20) - 1)]
        return greedy_identity(decoder_spec, decoder_plain, prompts, tokens)
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
    verdict = ("consistent with lossless: no difference detected" if p > 0.01
               else "DIFFERENT: the method's samples do not follow the target's distribution")
    return {"test": "chi-square homogeneity", "p_value": p, "distinct_outcomes": len(set(spec) | set(plain)),
            "drafted_tokens": drafted, "accepted_tokens": accepted, "verdict": verdict}


def cmd_verify(args) -> int:
    import json

    import specdec

    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if args.draft_tokens < 1:
        raise SpecdecError(f"--draft-tokens must be >= 1, got {args.draft_tokens}")
    # a fixed K: every step speculates, so the verifier is exercised on every sample
    spec = specdec.load(target=args.target, draft=args.draft, method=args.method, dtype=args.dtype,
                        draft_tokens=args.draft_tokens)
    if args.temperature == 0.0 and args.tokens == 2:
        args.tokens = 64
    plain = specdec.load(target=args.target, method="none", dtype=args.dtype)
    report = certify(spec, plain, args.prompt, args.samples, args.tokens, sampling)
    report.update(method=args.method, samples_per_method=args.samples, tokens=args.tokens, **sampling)
    if args.json:
        print(json.dumps(report))
    else:
        p = "" if report["p_value"] is None else f" p-value={report['p_value']:.4g}"
        print(f"{args.method} vs none, {args.samples} samples x {args.tokens} tokens at "
              f"T={args.temperature}:{p}\nverdict: {report['verdict']}")
    return 0 if "DIFFERENT" not in report["verdict"] else 1


def add_parser(sub) -> None:
    from specdec.api import METHODS

    v = sub.add_parser("verify", help="check that a method reproduces plain decoding's distribution")
    v.add_argument("--target")
    v.add_argument("--draft")
    v.add_argument("--method", required=True, choices=[m for m in METHODS if m != "none"])
    v.add_argument("--prompt", default="def ")
    v.add_argument("--temperature", type=float, default=1.0)
    v.add_argument("--top-k", type=int, default=0)
    v.add_argument("--top-p", type=float, default=1.0)
    v.add_argument("--min-p", type=float, default=0.0)
    v.add_argument("--samples", type=int, default=2000)
    v.add_argument("--tokens", type=int, default=2)
    v.add_argument("--draft-tokens", type=int, default=4,
                   help="drafted tokens (tree nodes for medusa/eagle) every step (default 4)")
    v.add_argument("--dtype", default="float32")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)
