"""Fixed prompt suites built from the held-out CPython stdlib files (never trained on), shared
by `specdec bench` (speed), `specdec verify` (greedy identity) and the tests.

Raw-text tasks (code, edit, freetext) suit any model. The instruction tasks (chat, rewrite)
are chat messages, rendered with the model's own chat template (`render_chat`), so an
instruct model such as SmolLM2 sees them the way it was trained to."""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from specdec.chat.fim import find_fim_family
from specdec.errors import SpecdecError

TASKS = ("code", "edit", "freetext", "chat", "rewrite", "fim", "longcode")
RAW_TASKS = ("code", "edit", "freetext")
CHAT_TASKS = ("chat", "rewrite")
MAX_CHAT_SOURCE = 1500  # characters of code quoted in an instruction (keeps prompts ~500 tokens)
# longcode: characters of the file above the function (what an editor's completion sends; ~3k tokens of
# Python for SmolLM2's and Qwen's tokenizers), where the attention over the prompt weighs on every pass
LONG_CONTEXT = 10_000
CHAT_INSTRUCTIONS = (
    "Explain what this Python function does, step by step.",
    "Write a docstring for this Python function. Reply with the function including its docstring.",
    "Write pytest unit tests for this Python function.",
)


@dataclass
class Prompt:
    task: str  # one of TASKS
    name: str  # the stdlib file the prompt comes from
    text: str  # what the model is given; for chat tasks the user message until render_chat
    messages: list[dict] | None = None  # chat tasks: the conversation the text is rendered from
    gap: tuple[str, str] | None = None  # fim: (prefix, suffix) the text is rendered from (render_fim)


class ChatRenderer(Protocol):
    def render(self, messages: list[dict]) -> str: ...


def long_functions(path: Path, min_lines: int = 7) -> tuple[list[str], list[ast.FunctionDef]]:
    """A Python file's lines and its functions or methods of at least `min_lines` lines
    (none if the file does not parse)."""
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [], []
    return source.splitlines(keepends=True), [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                                              and node.end_lineno - node.lineno >= min_lines - 1]


def function_snippets(path: Path, min_lines: int = 7, context_lines: int = 12) -> list[tuple[str, str]]:
    """(lines before the body: some context and the signature, full source) for every function
    or method of at least `min_lines` lines in a Python file; [] if the file does not parse."""
    lines, funcs = long_functions(path, min_lines)
    out = []
    for node in funcs:
        start = node.lineno - 1 - len(node.decorator_list)
        header = "".join(lines[max(0, start - context_lines):node.body[0].lineno - 1])
        out.append((header, "".join(lines[start:node.end_lineno])))
    return out


def file_prefixes(path: Path, min_lines: int = 7, chars: int = LONG_CONTEXT) -> list[str]:
    """The file up to each long function's body, its signature last, for the functions with at
    least `chars` characters before them: the last `chars` of it, from a line's start."""
    lines, funcs = long_functions(path, min_lines)
    out = []
    for node in funcs:
        text = "".join(lines[:node.body[0].lineno - 1])
        if len(text) >= chars:
            text = text[-chars:]
            out.append(text[text.find("\n") + 1:])
    return out


def gap_snippets(path: Path, min_lines: int = 7, context_lines: int = 12,
                 after_lines: int = 24) -> list[tuple[str, str]]:
    """(prefix, suffix) around each long function's body, as an editor would send them for a
    cursor at the body's start: context, signature and docstring before; the code after the
    function (up to after_lines lines) behind."""
    lines, funcs = long_functions(path, min_lines)
    out = []
    for node in funcs:
        first = node.body[1] if len(node.body) > 1 and _is_docstring(node.body[0]) else node.body[0]
        start = node.lineno - 1 - len(node.decorator_list)
        prefix = "".join(lines[max(0, start - context_lines):first.lineno - 1])
        suffix = "".join(lines[node.end_lineno:node.end_lineno + after_lines])
        if suffix.strip():
            out.append((prefix, suffix))
    return out


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def rename_target(source: str, min_uses: int = 3) -> str | None:
    """The function's most used parameter (not self/cls) if it appears at least `min_uses`
    times, so that a rename touches several lines; None otherwise."""
    try:
        func = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(func, ast.FunctionDef):
        return None
    params = [a.arg for a in func.args.args + func.args.kwonlyargs if a.arg not in ("self", "cls")]
    uses = {p: len(re.findall(rf"\b{re.escape(p)}\b", source)) for p in params if len(p) > 1}
    best = max(uses, key=uses.get, default=None)
    return best if best is not None and uses[best] >= min_uses else None


def _code_block(src: str) -> str:
    return f"```python\n{src.rstrip()}\n```"


def chat_prompts(funcs: list[tuple[str, str, str]], per_task: int) -> list[Prompt]:
    """Instructions about held-out functions: explain / write a docstring / write tests (in
    turn), and a rename whose answer repeats most of the quoted code."""
    short = [(name, textwrap.dedent(src)) for name, _, src in funcs if len(src) <= MAX_CHAT_SOURCE]
    out = []
    for i, (name, src) in enumerate(short[:per_task]):
        text = f"{CHAT_INSTRUCTIONS[i % len(CHAT_INSTRUCTIONS)]}\n\n{_code_block(src)}"
        out.append(Prompt("chat", name, text, [{"role": "user", "content": text}]))
    renames = [(name, src, old) for name, src in short if (old := rename_target(src))]
    for name, src, old in renames[:per_task]:
        text = (f"Rename the parameter `{old}` to `{old}_arg` everywhere in this function. Reply with "
                f"the complete updated function only.\n\n{_code_block(src)}")
        out.append(Prompt("rewrite", name, text, [{"role": "user", "content": text}]))
    return out


def build_suite(per_task: int = 3, tasks: tuple[str, ...] | list[str] = RAW_TASKS + CHAT_TASKS) -> list[Prompt]:
    """`per_task` prompts for each of `tasks` (in TASKS order), evenly spread over the held-out
    functions: code = complete a function from its signature, edit = copy a function shown
    above (prompt lookup's best case), freetext = write comments after a module's code; chat
    and rewrite: see chat_prompts (functions between those the raw tasks use); fim = fill in a
    function's body between its signature and the code after it (render_fim); longcode = complete
    a function deep in a file from the ~10,000 characters above it (file_prefixes)."""
    from specdec.data.corpus import split_files, stdlib_root

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SpecdecError(f"unknown task {unknown[0]!r}; choose from {', '.join(TASKS)}")
    _, held = split_files(stdlib_root())
    funcs = [(p.name, h, s) for p in held for h, s in function_snippets(p)]
    if not funcs:
        raise SpecdecError("no held-out functions found to build the prompt suite")
    step = max(1, len(funcs) // (3 * per_task))
    picked = funcs[::step]
    prompts = []
    for name, header, _ in picked[:per_task]:
        prompts.append(Prompt("code", name, header[-1200:]))
    for name, _, src in picked[per_task:2 * per_task]:
        first_line = src.splitlines(keepends=True)[0]
        prompts.append(Prompt("edit", name, f"{src[:1500]}\n\n# Copy of the function above, unchanged:\n{first_line}"))
    for name, _, src in picked[2 * per_task:3 * per_task]:
        prompts.append(Prompt("freetext", name, f"{src[-600:]}\n\n# Notes\n#\n# This module is used to"))
    if any(t in CHAT_TASKS for t in tasks):
        prompts += chat_prompts(funcs[step // 2::step] + funcs[:step // 2], per_task)
    if "longcode" in tasks:
        longs = [(p.name, text) for p in held for text in file_prefixes(p)]
        every = max(1, len(longs) // per_task)
        for name, text in longs[every // 2::every][:per_task]:
            prompts.append(Prompt("longcode", name, text))
    if "fim" in tasks:
        gaps = [(p.name, prefix, suffix) for p in held for prefix, suffix in gap_snippets(p)]
        for name, prefix, suffix in gaps[max(1, len(gaps) // per_task) // 3::max(1, len(gaps) // per_task)][:per_task]:
            prompts.append(Prompt("fim", name, "", gap=(prefix[-1200:], suffix[:800])))
    return [p for t in TASKS if t in tasks for p in prompts if p.task == t]


def render_fim(prompts: list[Prompt], tokenizer) -> list[Prompt]:
    """Fill-in-the-middle prompts with their text in the model's FIM markers (a tokenizer
    reads the markers back as their special tokens); other prompts unchanged."""
    if not any(p.gap is not None for p in prompts):
        return prompts
    family = find_fim_family(tokenizer)
    if family is None:
        raise SpecdecError("the fim task needs a model with fill-in-the-middle tokens (such as qwen-coder)")
    return [replace(p, text=f"{family.prefix}{p.gap[0]}{family.suffix}{p.gap[1]}{family.middle}")
            if p.gap is not None else p for p in prompts]


def render_chat(prompts: list[Prompt], template: ChatRenderer) -> list[Prompt]:
    """Chat-task prompts with their text rendered by the model's chat template (generation
    prompt included); raw-text prompts unchanged."""
    return [replace(p, text=template.render(p.messages)) if p.messages is not None else p for p in prompts]
