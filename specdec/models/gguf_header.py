"""A GGUF file's header (metadata and tensor directory), parsed by the `gguf` package once per
file version and remembered beside the user's cache as JSON.

gguf's reader makes a NumPy view for every string of a vocabulary: a 152k-token file (Qwen2.5)
takes ~17 s to open, every time, and its parsed form holds ~0.5-0.8 GB of Python objects. The
header is plain data, so after the first parse it is kept as JSON (never pickle) keyed by the
file's path, size and modification time, and the tensors are memory-mapped from the offsets it
records."""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HEADER_FORMAT = 1  # bump when what the JSON holds changes
# Parses faster than this are not remembered (small test files: nothing to gain, no litter).
REMEMBER_AFTER_SECONDS = 1.0
_TYPED = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the directory: what gguf's ReaderTensor says of it, without the reader."""
    path: Path
    name: str
    type_name: str  # gguf.GGMLQuantizationType member name: "Q4_K", "F32", ...
    dims: tuple[int, ...]  # GGUF order (fastest-varying first)
    n_bytes: int
    data_offset: int

    @property
    def tensor_type(self):
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType[self.type_name]

    @property
    def shape(self) -> np.ndarray:
        return np.array(self.dims, dtype=np.uint64)

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes, memory-mapped, shaped as gguf's reader shapes them (elements for
        float and integer types, rows of blocks' bytes for quantized ones)."""
        from gguf.quants import quant_shape_to_byte_shape

        shape = tuple(reversed(self.dims))
        if self.type_name in _TYPED:
            dtype, count = _TYPED[self.type_name], int(np.prod(self.dims))
        else:
            dtype, count, shape = np.uint8, self.n_bytes, quant_shape_to_byte_shape(shape, self.tensor_type)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.data_offset, shape=(count,)).reshape(shape)


def read_header(path: Path, size: int, mtime_ns: int,
                parse_values) -> tuple[dict[str, Any], list[TensorInfo]]:
    """(metadata, tensors) of the GGUF at `path` (resolved): from the remembered JSON when it
    matches this version of the file, else parsed by gguf (parse_values: reader fields -> dict)
    and remembered when that was slow."""
    key = {"format": HEADER_FORMAT, "path": str(path), "size": size, "mtime_ns": mtime_ns}
    remembered = _remembered(key)
    if remembered is not None:
        return remembered
    from gguf import GGUFReader

    start = time.perf_counter()
    reader = GGUFReader(str(path))
    metadata = parse_values(reader.fields)
    tensors = [TensorInfo(path, t.name, t.tensor_type.name, tuple(int(n) for n in t.shape.tolist()),
                          int(t.n_bytes), int(t.data_offset)) for t in reader.tensors]
    del reader
    if time.perf_counter() - start > REMEMBER_AFTER_SECONDS:
        _remember(key, metadata, tensors)
    return metadata, tensors


def headers_dir() -> Path:
    """$XDG_CACHE_HOME/specdec/gguf-headers (default ~/.cache/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec" / "gguf-headers"


def _file_for(key: dict) -> Path:
    digest = hashlib.sha256(key["path"].encode()).hexdigest()[:16]
    return headers_dir() / f"{Path(key['path']).stem[:40]}-{digest}.json"


def _remembered(key: dict) -> tuple[dict[str, Any], list[TensorInfo]] | None:
    file = _file_for(key)
    try:
        saved = json.loads(file.read_text())
        if saved.get("key") != key:
            return None
        path = Path(key["path"])
        return saved["metadata"], [TensorInfo(path, name, kind, tuple(dims), n_bytes, offset)
                                   for name, kind, dims, n_bytes, offset in saved["tensors"]]
    except (OSError, ValueError, KeyError, TypeError):  # absent, unreadable or another format: parse again
        return None


def _remember(key: dict, metadata: dict[str, Any], tensors: list[TensorInfo]) -> None:
    file = _file_for(key)
    record = {"key": key, "metadata": metadata,
              "tensors": [[t.name, t.type_name, list(t.dims), t.n_bytes, t.data_offset] for t in tensors]}
    write_cached(file, json.dumps(record, ensure_ascii=False))


def write_cached(file: Path, text: str) -> None:
    """Write a cache file whole or not at all (a reader never sees half a file); a read-only
    cache is skipped: the work is redone each time, as without one."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(file)
    except OSError:
        pass
