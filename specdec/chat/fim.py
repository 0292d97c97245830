"""Fill-in-the-middle prompts: the text before and after a gap (an editor's cursor), wrapped
in the model's FIM tokens so that the model writes the middle. Prefix-suffix-middle order, with
optional repository context (other files' text) ahead of the prefix, as code models were trained.

The prompt is fitted to a token budget by dropping the oldest context files first, then keeping
the end of the prefix and the start of the suffix (the text nearest the cursor)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class FimFamily:
    prefix: str
    suffix: str
    middle: str
    file_sep: str | None  # begins a context file: "<file_sep>{name}\n{text}"
    ends: tuple[str, ...]  # tokens besides EOS that end a middle


# How model families spell their FIM tokens (first match in the vocabulary wins).
FAMILIES = (
    FimFamily("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>",
              ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")),  # Qwen2.5-Coder
    FimFamily("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>",
              ("<fim_pad>", "<file_sep>", "<repo_name>")),  # StarCoder(2), SmolLM
    FimFamily("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None, ()),  # DeepSeek-Coder
    FimFamily("▁<PRE>", "▁<SUF>", "▁<MID>", None, ("▁<EOT>",)),  # CodeLlama
)


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    file_sep: int | None
    ends: tuple[int, ...]  # stop_token_ids of a FIM request (the markers too: a middle holds none)


@dataclass(frozen=True)
class FimPrompt:
    ids: list[int]
    truncated: bool  # context files, prefix or suffix were cut to fit the budget
    prefix_tokens: int  # of the prefix kept
    suffix_tokens: int
    extra_files: int  # context files kept
    stop_token_ids: tuple[int, ...]  # what else ends the middle (FimTokens.ends)


def find_fim_family(tokenizer) -> FimFamily | None:
    """The first family whose three markers are all in the vocabulary (tokenizer: anything with
    token_id(text) -> id or None), or None."""
    return next((f for f in FAMILIES if None not in (tokenizer.token_id(t) for t in (f.prefix, f.suffix, f.middle))),
                None)


def find_fim_tokens(tokenizer) -> FimTokens | None:
    """The tokenizer's FIM tokens, or None when the vocabulary has none of the known families."""
    family = find_fim_family(tokenizer)
    if family is None:
        return None
    ids = [tokenizer.token_id(t) for t in (family.prefix, family.suffix, family.middle)]
    sep = tokenizer.token_id(family.file_sep) if family.file_sep else None
    ends = [tokenizer.token_id(t) for t in family.ends]
    return FimTokens(*ids, sep, tuple(dict.fromkeys(i for i in [*ends, *ids] if i is not None)))


def fim_prompt(tokenizer, fim: FimTokens, prefix: str, suffix: str,
               extra: Sequence[tuple[str, str]] = (), typed: str = "", budget: int | None = None) -> FimPrompt:
    """Prompt ids for the middle between prefix and suffix. extra: (file name, text) of other files
    for context; typed: text the middle already starts with (after the middle token, as
    llama.cpp's /infill `prompt`). budget: at most this many prompt tokens (None: no limit)."""
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text) if text else []

    files = [([fim.file_sep] if fim.file_sep is not None else []) + encode(f"{name}\n{text}" if name else text)
             for name, text in extra]
    prefix_ids, suffix_ids, typed_ids = encode(prefix), encode(suffix), encode(typed)
    fixed = 3 + len(typed_ids)  # the three markers and the typed start
    whole = fixed + len(prefix_ids) + len(suffix_ids)
    if budget is not None:
        if budget < fixed + 1:
            raise SpecdecError(f"a fill-in-the-middle prompt needs at least {fixed + 1} tokens here "
                               f"(markers{' and the typed start' if typed_ids else ''} and one of prefix or "
                               f"suffix); only {budget} fit beside the tokens to generate")
        while files and whole + sum(map(len, files)) > budget:
            files.pop(0)  # the oldest context first
        room = budget - fixed - sum(map(len, files))
        if len(prefix_ids) + len(suffix_ids) > room:
            # the suffix gets a quarter of the room, or more when the prefix is short
            keep_suffix = min(len(suffix_ids), max(room // 4, room - len(prefix_ids)))
            keep_prefix = room - keep_suffix
            prefix_ids = prefix_ids[len(prefix_ids) - keep_prefix:] if keep_prefix else []
            suffix_ids = suffix_ids[:keep_suffix]
    ids = [t for f in files for t in f]
    ids += [fim.prefix, *prefix_ids, fim.suffix, *suffix_ids, fim.middle, *typed_ids]
    truncated = len(files) < len(extra) or fixed + len(prefix_ids) + len(suffix_ids) < whole
    return FimPrompt(ids, truncated, len(prefix_ids), len(suffix_ids), len(files), fim.ends)


def require_fim_tokens(tokenizer, model_name: str = "this model") -> FimTokens:
    fim = find_fim_tokens(tokenizer)
    if fim is None:
        spellings = ", ".join(f.prefix for f in FAMILIES)
        raise SpecdecError(f"{model_name} has no fill-in-the-middle tokens (looked for {spellings} and their "
                           "suffix and middle tokens): use a code model trained for infilling, such as "
                           "qwen-coder")
    return fim
