"""Fixed prompt suites built from the held-out CPython stdlib files (never trained on), shared
by `specdec bench` (speed), `specdec verify` (greedy identity) and the tests."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

TASKS = ("code", "edit", "freetext")


@dataclass
class Prompt:
    task: str  # one of TASKS
    name: str  # the stdlib file the prompt comes from
    text: str


def function_snippets(path: Path, min_lines: int = 7, context_lines: int = 12) -> list[tuple[str, str]]:
    """(lines before the body: some context and the signature, full source) for every function
    or method of at least `min_lines` lines in a Python file; [] if the file does not parse."""
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= min_lines - 1:
            body_start = node.body[0].lineno - 1
            start = node.lineno - 1 - len(node.decorator_list)
            header = "".join(lines[max(0, start - context_lines):body_start])
            out.append((header, "".join(lines[start:node.end_lineno])))
    return out


def build_suite(per_task: int = 3) -> list[Prompt]:
    """`per_task` prompts for each task, evenly spread over the held-out functions:
    code = complete a function from its signature, edit = copy a function shown above
    (prompt lookup's best case), freetext = write comments after a module's code."""
    from specdec.train.corpus import split_files, stdlib_root

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
    return prompts
