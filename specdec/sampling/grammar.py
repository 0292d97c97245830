"""Structured output: a grammar (a JSON schema, any JSON object, a regex or a Lark grammar)
decides which tokens may come next, and the model samples only among them.

Why it stays lossless under speculation: the grammar is one more per-row adjustment of the
logits, like the penalties (penalties.py, which carries it: TokenHistory.rows). Row i of a
chain pass follows the context plus drafts[:i], a tree node's row follows the node's path;
GrammarState.masks walks the matcher along each row's path, reads the allowed set there and
rolls back, so the target's and every drafter's distributions are the constrained ones at
every position, and rejection sampling (greedy, seeded choice) emits exactly the constrained
target's tokens. A row whose path holds a token the grammar refuses (or an EOS) is never
emitted from: the refused draft has probability 0 under the constrained target, so it is
rejected there (greedy never picks it), and what was drafted after it is dropped; such rows
get an all-allowed mask, which keeps them finite. Emitted tokens are committed to the matcher
(GrammarState.commit). Masks are cached per path within a step, so the target's rows reuse
the masks the drafter already computed. Tokens the grammar forces (GrammarState.forced) are
free drafts for prompt lookup: the constrained target gives them probability 1.

The matcher is llguidance (Rust, no dependencies, an Earley parser built lazily: no up-front
compile; scripts/grammar_mask_cost.py measures it against xgrammar and outlines-core). The
walk needs three operations (Matcher), so the exactness tests drive the same code with a toy
grammar on a 3-token vocabulary."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.extras import require

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "lark")
# JSON as json.dumps writes it (what models tend to write), and no free whitespace: a model
# may otherwise emit newlines forever inside an object
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """What the output must match. source: the JSON schema as JSON text, the regex, the Lark
    grammar; empty for json_object (any JSON object)."""
    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise SpecdecError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise SpecdecError(f"a {self.kind} grammar's source must be a string, got {type(self.source).__name__}")
        if self.kind != "json_object" and not self.source:
            raise SpecdecError(f"a {self.kind} grammar needs its source")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))


def grammar_from_response_format(fmt: dict | None) -> Grammar | None:
    """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}; extensions
    {"type": "regex", "regex": "..."} and {"type": "lark", "grammar": "..."}."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise SpecdecError(f"response_format must be an object, got {type(fmt).__name__}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise SpecdecError('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}')
        schema = spec.get("schema", {})
        return Grammar("json_schema", json.dumps(schema if schema is not True else {}))
    if kind in ("regex", "lark"):
        key = "regex" if kind == "regex" else "grammar"
        source = fmt.get(key)
        if not isinstance(source, str) or not source:
            raise SpecdecError(f'response_format {kind} needs "{key}": a non-empty string')
        return Grammar(kind, source)
    raise SpecdecError("response_format type must be one of text, json_object, json_schema, regex, lark; "
                       f"got {kind!r}")


class Matcher(Protocol):
    """A grammar's parse state over token ids."""

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar takes next (EOS where it may end)."""

    def try_consume(self, tokens: list[int]) -> int:
        """Consume the longest allowed prefix of tokens; return its length."""

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens."""


class GrammarState:
    """One sequence's grammar: the committed output, and masks for rows that follow drafts."""

    def __init__(self, matcher: Matcher, vocab_size: int, eos_ids: frozenset[int] = frozenset()):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}
        self._anything = torch.ones(vocab_size, dtype=torch.bool)

    def commit(self, tokens: list[int]) -> None:
        """Emitted tokens (up to an EOS, which ends the output)."""
        self._masks.clear()
        for i, t in enumerate(tokens):
            if t in self.eos_ids:
                tokens = tokens[:i]
                break
        if self.matcher.try_consume(tokens) != len(tokens):
            raise SpecdecError("an emitted token left the grammar (a bug: every row is masked)")

    def mask(self, path: list[int]) -> torch.Tensor:
        """[V] bool: the tokens allowed after the output plus path."""
        key = tuple(path)
        row = self._masks.get(key)
        if row is None:
            row = self._masks[key] = self._walk(path)
        return row

    def masks(self, paths: list[list[int]]) -> torch.Tensor:
        """[R, V] bool, one row per path (penalties.TokenHistory.rows)."""
        return torch.stack([self.mask(p) for p in paths])

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens the grammar accepts after the output (prompt lookup cuts its
        proposal there)."""
        n = 0
        while n < len(tokens) and bool(self.mask(tokens[:n])[tokens[n]]):
            n += 1
            if tokens[n - 1] in self.eos_ids:  # the output ends there
                break
        return n

    def forced(self, path: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces after the output plus path (each the only
        token allowed where it stands): free drafts that the constrained target always
        accepts, e.g. the keys and punctuation of a JSON schema."""
        out: list[int] = []
        while len(out) < limit:
            row = self.mask(path + out)
            if int(row.sum()) != 1:
                break
            token = int(row.nonzero()[0, 0])
            out.append(token)
            if token in self.eos_ids:
                break
        return out

    def _walk(self, path: list[int]) -> torch.Tensor:
        if any(t in self.eos_ids for t in path):
            return self._anything  # after the end: never emitted from
        n = self.matcher.try_consume(path)
        try:
            if n < len(path):
                return self._anything  # after a refused token: never emitted from
            row = self.matcher.allowed()
        finally:
            self.matcher.rollback(n)
        if not row.any():  # a grammar that can neither go on nor end: let it end
            row = row.clone()
            row[list(self.eos_ids)] = True
        return row


class LLGuidanceMatcher:
    """Matcher over an llguidance LLMatcher. The mask is written into a preallocated bitmask
    (one bit per token, ~1 us once the parser has seen the state) and unpacked by numpy (~4 us
    for 49k tokens; torch's shift-and-mask takes ~14)."""

    def __init__(self, matcher, vocab_size: int):
        self.m = matcher
        self.vocab_size = vocab_size
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self) -> torch.Tensor:
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return torch.from_numpy(np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
                                .view(bool))

    def try_consume(self, tokens: list[int]) -> int:
        if not tokens:
            return 0
        n = self.m.try_consume_tokens(tokens)
        if self.m.is_error():
            raise SpecdecError(f"grammar matcher error: {self.m.get_error()}")
        return n

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)


class GrammarCompiler:
    """Builds matchers for one tokenizer (the tokenizer's llguidance form costs ~0.2 s: built
    once, on first use)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: frozenset[int]):
        self.tokenizer = tokenizer  # specdec.engine.text.TextTokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._lltok = None
        self._checked: dict[Grammar, str] = {}  # recent grammars' checked text (a server sees the same ones often)
        self._lock = threading.Lock()  # the server's request parser and its engine worker share this

    def _ll_tokenizer(self):
        llguidance = require("llguidance", "grammar", "structured output (response_format, grammar=)")
        if self._lltok is None:
            self._lltok = llguidance.LLTokenizer(self.tokenizer.tok.to_str(), n_vocab=self.vocab_size,
                                                 eos_token=sorted(self.eos_ids) or None)
        return self._lltok

    def grammar_text(self, grammar: Grammar) -> str:
        from llguidance import LLMatcher
        try:
            if grammar.kind == "json_object":
                return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            if grammar.kind == "json_schema":
                return LLMatcher.grammar_from_json_schema(grammar.source, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise SpecdecError(f"invalid JSON schema: {e}") from None
        if grammar.kind == "regex":
            return LLMatcher.grammar_from_regex(grammar.source)
        return LLMatcher.grammar_from_lark(grammar.source)

    def check(self, grammar: Grammar) -> str:
        """The compiled grammar text; SpecdecError naming the problem when it is invalid."""
        with self._lock:
            if grammar in self._checked:
                return self._checked[grammar]
            lltok = self._ll_tokenizer()
        from llguidance import LLMatcher
        text = self.grammar_text(grammar)
        is_error, messages = LLMatcher.validate_grammar_with_warnings(text, lltok)
        if is_error:
            raise SpecdecError(f"invalid {grammar.kind.replace('_', ' ')} grammar: {messages[0]}")
        with self._lock:
            if len(self._checked) >= 64:
                self._checked.pop(next(iter(self._checked)))
            self._checked[grammar] = text
        return text

    def state(self, grammar: Grammar) -> GrammarState:
        if not self.eos_ids:  # the grammar's end must be a token that ends the generation
            raise SpecdecError("structured output needs a model with an end-of-sequence token")
        from llguidance import LLMatcher
        text = self.check(grammar)
        with self._lock:
            lltok = self._ll_tokenizer()
        matcher = LLMatcher(lltok, text, log_level=0)
        if matcher.is_error():
            raise SpecdecError(f"invalid {grammar.kind.replace('_', ' ')} grammar: {matcher.get_error()}")
        return GrammarState(LLGuidanceMatcher(matcher, self.vocab_size), self.vocab_size, self.eos_ids)
