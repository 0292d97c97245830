"""The training corpus: the running CPython's standard-library .py files, in a fixed order,
with a deterministic ~2% held-out split of whole files."""
from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

from specdec.errors import SpecdecError

SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_files(root: str | Path) -> list[Path]:
    """All .py files under root, skipping site-packages and test folders, sorted by path."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relpath: str, every: int = 50) -> bool:
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % every == 0


def split_files(root: str | Path) -> tuple[list[Path], list[Path]]:
    root = Path(root)
    train, held = [], []
    for p in python_files(root):
        (held if is_heldout(p.relative_to(root).as_posix()) else train).append(p)
    if not held and len(train) > 1:  # tiny corpora (tests): still hold one file out
        held.append(train.pop())
    return train, held


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def corpus_root(folder: str | None) -> Path:
    """The training corpus: a folder of Python files, or this Python's standard library."""
    root = Path(folder) if folder else stdlib_root()
    if not root.is_dir():
        raise SpecdecError(f"corpus folder {str(root)!r} does not exist")
    return root
