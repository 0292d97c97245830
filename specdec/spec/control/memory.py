"""What the draft-length and tree-size controllers learned, kept between processes.

Why: a fresh process knows nothing of how often this drafter's tokens are accepted at this
temperature, so its controller drafts to find out. Measured in one-shot CLI calls of 160
tokens at T=1 on the bundled pair: `eagle` ran ~5 trees of 4 nodes per call (2 to explore
each size, then probes), kept none, and the call ran at 0.93x of plain decoding. A process
that starts from the last one's acceptance and timings, on the same machine, model, drafter,
dtype and sampling settings, skips the exploration it already did (and still probes now and
then); recalled tree rates count as a couple of steps only, so this text's own steps soon
outweigh them.

One small JSON file, by default ~/.cache/specdec/controllers.json ($XDG_CACHE_HOME is
honoured); $SPECDEC_CONTROLLER_MEMORY names another file, or "off" turns it off. A file that
cannot be read or written is ignored: the controllers then start fresh, as they did before."""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import platform
import tempfile
import time
from functools import cache
from pathlib import Path

import torch

ENV_VAR = "SPECDEC_CONTROLLER_MEMORY"
MAX_ENTRIES = 256  # oldest entries go first
WRITE_EVERY_SECONDS = 5.0  # a server finishing many requests writes at most this often


def default_path() -> Path | None:
    """The file named by $SPECDEC_CONTROLLER_MEMORY, None if it says "off", else the cache file."""
    setting = os.environ.get(ENV_VAR, "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "specdec" / "controllers.json"


@cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


@cache
def _kernels_digest() -> str:
    """The kernels' source: timings learned before a change to them mislead (a draft pass
    remembered at 63 ms kept drafting off after it fell to 20 ms)."""
    from specdec.kernels.build import SOURCE

    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    except OSError:
        return "none"


def machine_key() -> str:
    """Timings hold for one machine, thread count and build of the kernels only."""
    from specdec.kernels.build import kernels_in_use

    chosen = "".join(f"/{name}={kernel}" for name, kernel in sorted(kernels_in_use().items()))
    return f"{platform.node()}/{_cpu_name()}/threads={torch.get_num_threads()}/kernels={_kernels_digest()}{chosen}"


class ControllerMemory:
    """Controller states by key (machine, model setup, sampling settings): the file is read once
    for recall, and this process's entries are merged into it, atomically, after generations."""

    def __init__(self, path: Path):
        self.path = path
        self._entries: dict[str, dict] | None = None
        self._changed: dict[str, dict] = {}  # entries this process wrote, not yet in the file
        self._last_write = 0.0
        self._exit_flush = False  # registered with atexit on the first remember()

    def _read(self) -> dict[str, dict]:
        try:
            loaded = json.loads(self.path.read_text())
            return loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            return {}

    def entries(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def recall(self, key: str) -> dict | None:
        entry = self.entries().get(key)
        return entry.get("state") if isinstance(entry, dict) and isinstance(entry.get("state"), dict) else None

    def remember(self, key: str, state: dict, force: bool = False) -> None:
        """Store a controller's state; written to the file now unless it was written less than
        WRITE_EVERY_SECONDS ago (then with a later call, or flush())."""
        entry = {"state": state, "saved": time.time()}
        if not self._exit_flush:  # what a throttled write leaves unwritten
            self._exit_flush = True
            atexit.register(self.flush)
        self.entries()[key] = self._changed[key] = entry
        if force or time.monotonic() - self._last_write >= WRITE_EVERY_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write this process's entries into the file as it is now (other processes may have
        written theirs since it was read), newest last, at most MAX_ENTRIES."""
        if not self._changed:
            return
        self._last_write = time.monotonic()
        entries = self._read()
        for key, entry in self._changed.items():
            entries.pop(key, None)  # re-inserted last: the dict's order is the eviction order
            entries[key] = entry
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        self._changed = {}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".controllers-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f)
            os.replace(tmp, self.path)  # another process reading sees the old file or the new one
        except OSError:  # read-only home, full disk: the controllers simply start fresh next time
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
