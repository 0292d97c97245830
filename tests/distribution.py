"""End-to-end distribution checks: sample the first tokens through the real engine on tiny
random models and compare with the target's exact joint distribution (chi-square)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.stats import chisquare

import specdec
from specdec.sampling import SamplingParams, final_probs

from helpers import make_model_dir

V = 8
NEW = 2
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive, so prompt lookup always has a proposal
N_QUICK = 3_000  # default tier: enough to catch the wrong verifiers in the power checks
N_SLOW = 20_000  # slow tier: the whole grid of methods and sampling settings
TINY = dict(vocab_size=V, tokenizer="char", hidden_size=16, layers=1, heads=2, kv_heads=1, max_pos=32)


def tiny_model_dir(path: Path, seed: int, scale: float) -> Path:
    """scale sets how peaked the model's distributions are (0.5: broad, 3: sharp)."""
    return make_model_dir(path, seed=seed, scale=scale, **TINY)


def reference_penalized(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                        output: list[int]) -> torch.Tensor:
    """The penalties and bias applied one token at a time in plain Python (the definition
    penalties.py vectorises): repetition over prompt + output, presence and frequency over
    the output, then the bias."""
    bias = dict(params.logit_bias)
    out = []
    for token, x in enumerate(logits.tolist()):
        n = output.count(token)
        if params.repetition_penalty != 1.0 and (token in prompt or n > 0):
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        x = x - params.frequency_penalty * n - (params.presence_penalty if n > 0 else 0.0) + bias.get(token, 0.0)
        out.append(x)
    return torch.tensor(out, dtype=torch.float64)


def unpenalized(params: SamplingParams) -> SamplingParams:
    return replace(params, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=())


def reference_probs(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The final distribution after prompt + output, penalties applied by the reference."""
    return final_probs(reference_penalized(logits, params, prompt, output), unpenalized(params))


def exact_joint(target_dir: Path, params: SamplingParams) -> dict:
    model = specdec.load(target=target_dir, dtype="float64").engine.target.model
    out = {}
    with torch.no_grad():
        first = reference_probs(model(torch.tensor([PROMPT]))[0, -1], params, PROMPT, [])
        for a in range(V):
            second = reference_probs(model(torch.tensor([PROMPT + [a]]))[0, -1], params, PROMPT, [a])
            for b in range(V):
                out[(a, b)] = float(first[a] * second[b])
    return out


def sample_counts(decoder, params_kw: dict, n: int, seed_mode: str = "rejection") -> dict:
    """seed_mode "rejection" (default): the seeds only make runs repeatable, the verifier under
    test is rejection sampling; "invariant": seeded races (specdec/sampling/seeded.py)."""
    counts: dict = {}
    for seed in range(n):  # ignore_eos: the exact joint treats token 0 as an ordinary token
        ids = tuple(decoder.generate(PROMPT, max_new_tokens=NEW, seed=seed, seed_mode=seed_mode, ignore_eos=True,
                                     **params_kw).token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    return counts


def chi_square_p(counts: dict, joint: dict) -> float:
    n = sum(counts.values())
    assert set(counts) <= {k for k, p in joint.items() if p > 0}, "sampled an impossible sequence"
    keys = sorted(joint, key=lambda k: -joint[k])
    obs, exp = [], []
    tail_o = tail_e = 0.0
    for k in keys:
        e = joint[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0)), exp.append(e)
        else:
            tail_o += counts.get(k, 0)
            tail_e += e
    if tail_e > 0:
        obs.append(tail_o), exp.append(tail_e)
    assert len(obs) >= 10, "degenerate test: the target distribution has too few outcomes"
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return float(chisquare(obs, exp).pvalue)


def p_value(decoder, target_dir: Path, params_kw: dict, n: int, seed_mode: str = "rejection") -> float:
    """p-value of the hypothesis that decoder samples the target's exact joint distribution."""
    return chi_square_p(sample_counts(decoder, params_kw, n, seed_mode),
                        exact_joint(target_dir, SamplingParams(**params_kw)))


def interleaved_p_values(results: list, settings: list[dict], target_dir: Path) -> list[float]:
    """results[i] sampled with settings[i % len(settings)]: per setting, the p-value of its
    results' token sequences against the target's exact joint distribution at that setting."""
    p_values = []
    for which, kw in enumerate(settings):
        counts: dict = {}
        for result in results[which::len(settings)]:
            counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        p_values.append(chi_square_p(counts, exact_joint(target_dir, SamplingParams(**kw))))
    return p_values


class PenalizedLM:
    """A model given as next-token distributions by prefix (enumerate.RandomLM), taken as
    logits (log p) and passed through the penalties one prefix at a time by the reference:
    the sequential definition of the penalised model that speculation must reproduce.
    Tokens after `prompt` in a prefix are the generated ones."""

    def __init__(self, lm, params: SamplingParams, prompt: tuple):
        self.lm, self.params, self.prompt, self.rows = lm, params, prompt, {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            self.rows[prefix] = reference_probs(self.lm(prefix).log(), self.params, list(self.prompt),
                                                list(prefix[len(self.prompt):]))
        return self.rows[prefix]
