"""A toy grammar over small vocabularies for the exactness proofs: no token twice in a row,
and never 2 right after 1. ToyMatcher is a specdec.sampling.grammar.Matcher (the engine's walk runs on
it unchanged); ConstrainedLM is the constrained model defined one prefix at a time, the
sequential definition speculation must reproduce."""
from __future__ import annotations

import torch

from specdec.sampling import SamplingParams

from distribution import reference_probs

BANNED = {(1, 2)}


def allowed_after(generated: tuple | list, vocab_size: int) -> torch.Tensor:
    last = generated[-1] if generated else None
    return torch.tensor([t != last and (last, t) not in BANNED for t in range(vocab_size)])


class ToyMatcher:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.tokens: list[int] = []

    def allowed(self) -> torch.Tensor:
        return allowed_after(self.tokens, self.vocab_size)

    def try_consume(self, tokens: list[int]) -> int:
        n = 0
        for t in tokens:
            if not bool(self.allowed()[t]):
                break
            self.tokens.append(t)
            n += 1
        return n

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n:]


class ConstrainedLM:
    """Next-token distributions of lm (a RandomLM) under the toy grammar over the tokens after
    `prompt`, with params' penalties and filters, by prefix."""

    def __init__(self, lm, params: SamplingParams, prompt: tuple, vocab_size: int):
        self.lm, self.params, self.prompt, self.vocab_size, self.rows = lm, params, prompt, vocab_size, {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            generated = prefix[len(self.prompt):]
            logits = self.lm(prefix).log().masked_fill(~allowed_after(generated, self.vocab_size), float("-inf"))
            self.rows[prefix] = reference_probs(logits, self.params, list(self.prompt), list(generated))
        return self.rows[prefix]
