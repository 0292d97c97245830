"""Presence, frequency and repetition penalties and logit bias: the part of the final
distribution that depends on the tokens a sequence already holds.

Under speculation that history differs row by row within one pass: row i of a chain pass
follows the context plus drafts[:i], the row of a tree node follows the context plus the
node's path from the root. The target (engine) and every drafter build their rows' counts
from the same TokenHistory with `rows(paths)` and adjust with the same pure function
(`adjust_logits`), so both distributions are the penalised ones at every position; greedy
decoding takes the argmax of the adjusted logits.

Conventions (OpenAI for presence/frequency/bias, Hugging Face and vLLM for repetition):
- presence and frequency count the GENERATED tokens only:
  logit -= presence * [count > 0] + frequency * count;
- repetition applies to tokens in the prompt or the output: a positive logit is divided by
  it, a negative one multiplied (so > 1 always makes a seen token less likely);
- logit_bias is added last, so -100 bans a token and +100 all but forces it whatever the
  penalties did.
The adjusted logits are clamped to the dtype's finite range, so an extreme repetition
penalty gives a (degenerate but) finite distribution. A grammar (grammar.py) is the last
adjustment: the tokens it refuses after a row's path get -inf, so they have probability 0."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.errors import SpecdecError
from specdec.sampling.grammar import GrammarState


class Penalties(Protocol):
    """The fields of SamplingParams read here (sampling.py imports this module, not the reverse)."""
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: tuple[tuple[int, float], ...]

    @property
    def penalized(self) -> bool: ...


@dataclass(frozen=True)
class PenaltyRows:
    """What adjust_logits needs for R rows of one pass."""
    output_counts: torch.Tensor | None  # [R, V] generated-token counts before each row; None: no count penalty
    in_prompt: torch.Tensor | None  # [V] bool; None unless repetition_penalty != 1
    bias_ids: torch.Tensor | None  # [B] token ids of logit_bias; None: no bias
    bias_values: torch.Tensor | None  # [B]
    allowed: torch.Tensor | None = None  # [R, V] bool: the grammar's tokens after each row's path; None: no grammar


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """The dtype final_probs works in: float64 stays, everything else becomes float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def adjust_logits(logits: torch.Tensor, params: Penalties, rows: PenaltyRows) -> torch.Tensor:
    """Penalties and bias applied to raw logits [R, V] (a pure function of its arguments)."""
    logits = logits.to(compute_dtype(logits))
    if rows.output_counts is not None:
        counts = rows.output_counts.to(device=logits.device, dtype=logits.dtype)
        present = counts > 0
        penalty = params.repetition_penalty
        if penalty != 1.0:
            seen = present | rows.in_prompt.to(logits.device)
            # where() evaluates both branches: the nested form never multiplies 0 by inf
            scaled = torch.where(logits > 0, logits / penalty, torch.where(logits < 0, logits * penalty, logits))
            logits = torch.where(seen, scaled, logits)
        if params.frequency_penalty:
            logits = logits - params.frequency_penalty * counts
        if params.presence_penalty:
            logits = logits - params.presence_penalty * present.to(logits.dtype)
    if rows.bias_ids is not None:
        bias = rows.bias_values.to(device=logits.device, dtype=logits.dtype)
        logits = logits.index_add(-1, rows.bias_ids.to(logits.device), bias.expand(*logits.shape[:-1], -1))
    limit = torch.finfo(logits.dtype).max
    logits = logits.clamp(-limit, limit)
    if rows.allowed is not None:
        logits = logits.masked_fill(~rows.allowed.to(logits.device), float("-inf"))
    return logits


class TokenHistory:
    """The tokens of one sequence so far, kept as counts the engine updates after each step
    (`extend`), and its grammar's state; built only when params.penalized or a grammar
    constrains the output, so plain sampling pays nothing."""

    def __init__(self, params: Penalties, prompt_ids: list[int], vocab_size: int, grammar: GrammarState | None = None):
        for token, _ in params.logit_bias:
            if token >= vocab_size:
                raise SpecdecError(f"logit_bias names token id {token}, outside the vocabulary "
                                   f"(ids 0 to {vocab_size - 1})")
        self.params = params
        self.grammar = grammar
        self.counting = bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0)
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float64)
        self.in_prompt = None
        if params.repetition_penalty != 1.0:
            self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool)
            self.in_prompt[torch.tensor(prompt_ids, dtype=torch.long)] = True
        self.bias_ids = self.bias_values = None
        if params.logit_bias:
            self.bias_ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
            self.bias_values = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float64)

    def extend(self, tokens: list[int]) -> None:
        """Tokens appended to the output."""
        if self.grammar is not None:
            self.grammar.commit(tokens)
        if tokens and self.counting:
            self.output_counts.index_add_(0, torch.tensor(tokens, dtype=torch.long),
                                          torch.ones(len(tokens), dtype=torch.float64))

    def rows(self, paths: list[list[int]]) -> PenaltyRows:
        """One row per path: the output so far plus that path's tokens (drafts before a chain
        position, or a tree node's path)."""
        counts = None
        if self.counting:
            counts = self.output_counts.expand(len(paths), -1).clone()
            row_index = [r for r, path in enumerate(paths) for _ in path]
            if row_index:
                tokens = [t for path in paths for t in path]
                counts.index_put_((torch.tensor(row_index), torch.tensor(tokens)),
                                  torch.ones(len(tokens), dtype=torch.float64), accumulate=True)
        allowed = self.grammar.masks(paths) if self.grammar is not None else None
        return PenaltyRows(counts, self.in_prompt, self.bias_ids, self.bias_values, allowed)


def history_for(params: Penalties, prompt_ids: list[int], vocab_size: int,
                grammar: GrammarState | None = None) -> TokenHistory | None:
    if params.penalized or grammar is not None:
        return TokenHistory(params, prompt_ids, vocab_size, grammar)
    return None


def chain_paths(drafts: list[int]) -> list[list[int]]:
    """Rows of a chain pass over [last] + drafts: row i follows drafts[:i]."""
    return [drafts[:i] for i in range(len(drafts) + 1)]


def tree_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Rows of a tree pass over [root] + nodes: the root follows nothing new, node i's row
    follows its path (ancestors, then the node itself)."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents):
        paths.append(paths[parent + 1] + [token])
    return paths
