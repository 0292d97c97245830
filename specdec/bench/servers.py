"""The servers `specdec bench-serve` measures: a URL given, or one it starts (`specdec serve`
in a subprocess on a free port; llama-server through llama_cpp.py)."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench.llama_cpp import stop_server
from specdec.errors import SpecdecError

STARTUP_SECONDS = 900.0  # loading and calibrating a model, or writing a GGUF, can take minutes


@dataclass
class Target:
    """A server to measure: its report name, URL, model id (None: ask /v1/models), and how it
    was started (for the JSON)."""
    name: str
    url: str | None = None  # None until started
    model: str | None = None
    api_key: str | None = None
    extra_body: dict = field(default_factory=dict)
    start: Callable[[ExitStack], str] | None = None  # starts a server this command runs; -> its URL
    command: list[str] | None = None


class SpecdecServer:
    """`specdec serve` in a subprocess on a free port; a context manager."""

    def __init__(self, args: list[str], startup_seconds: float = STARTUP_SECONDS):
        from specdec.bench.llama_cpp import _free_port

        self.port = _free_port()
        self.command = [sys.executable, "-m", "specdec.cli.main", "serve", "--port", str(self.port),
                        "--log-level", "warning", *args]
        self.startup_seconds = startup_seconds
        self.process: subprocess.Popen | None = None
        self.log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SpecdecServer:
        import httpx

        self.log = tempfile.NamedTemporaryFile(prefix="specdec-serve-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = f"specdec serve exited with status {self.process.returncode}:\n{self.log_tail()}"
                self.__exit__()
                raise SpecdecError(message)
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        message = f"specdec serve did not become ready within {self.startup_seconds:.0f} s:\n{self.log_tail()}"
        self.__exit__()
        raise SpecdecError(message)

    def __exit__(self, *exc) -> None:
        stop_server(self.process, self.log, timeout=15)

    def log_tail(self, lines: int = 20) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- arguments
