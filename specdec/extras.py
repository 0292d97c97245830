"""Optional dependencies. A plain `pip install specdec` has only torch, numpy, safetensors and
tokenizers; the rest come with extras, imported only where needed, so a missing one is a
clear SpecdecError naming the extra instead of an ImportError at start-up."""
from __future__ import annotations

import importlib
from types import ModuleType

from specdec.errors import SpecdecError

# extra -> what it brings (mirrors pyproject.toml's [project.optional-dependencies])
EXTRAS = {
    "hf": ("transformers",),
    "bench": ("httpx", "matplotlib", "scipy", "rich", "transformers"),
    "train": ("rich",),
    "gguf": ("gguf", "transformers"),
    "server": ("fastapi", "uvicorn", "prometheus_client", "jinja2", "llguidance"),
    "chat": ("jinja2",),
    "grammar": ("llguidance",),
    "ray": ("ray",),
}


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import `module` (e.g. "rich.table"), or say which extra to install."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = (e.name or module).split(".")[0]
        what = purpose or "this feature of specdec"
        raise SpecdecError(f"{what} needs {missing!r}, which is not installed: "
                           f"pip install 'specdec[{extra}]'") from None
