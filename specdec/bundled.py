"""The model family shipped inside the package (trained here on the CPython stdlib)."""
from __future__ import annotations

from pathlib import Path

BUNDLED_DIR = Path(__file__).parent / "bundled_models"
DEFAULT_TARGET = BUNDLED_DIR / "pycode-target"
DEFAULT_DRAFT = BUNDLED_DIR / "pycode-draft"
DEFAULT_MEDUSA = BUNDLED_DIR / "pycode-target-medusa"
DEFAULT_EAGLE = BUNDLED_DIR / "pycode-target-eagle"


def bundled_models() -> list[Path]:
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())
