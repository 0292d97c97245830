"""Drive a llama.cpp `llama-server` process over HTTP, as a peer to measure against and as a
check that the GGUF files specdec writes run in llama.cpp with the same greedy tokens.

One server per configuration (plain, or one speculative type); prompts are sent as token ids
(so every engine sees exactly the same ids, and llama.cpp adds no BOS), with `cache_prompt`
off (every request pays for its prompt, as specdec's generate() does) and a sampler chain of
temperature alone (llama.cpp's default chain adds top-k 40, top-p 0.95, min-p 0.05)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specdec.errors import SpecdecError

ENV_VAR = "SPECDEC_LLAMA_CPP"  # a llama.cpp build folder (holding llama-server) or the binary
SERVER = "llama-server"
# --spec-type arguments per bench configuration. ngram-simple with a 3-token key and up to 8
# drafted tokens matches specdec's own prompt lookup (n-grams of 3..1 tokens, K <= 8);
# ngram-mod is llama.cpp's own n-gram drafter with its default settings.
SPEC_ARGS = {
    "none": [],
    "ngram": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    # a draft model (given with extra_args "-md FILE"): llama.cpp's default of up to 3 drafted
    # tokens raised to 4, as measured for the Qwen2.5-Coder pair (../shared/PEERS.md)
    "draft": ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
}


def find_llama_server(where: str | Path | None = None) -> Path | None:
    """llama-server from `where` (a build folder or the binary), else $SPECDEC_LLAMA_CPP, else
    PATH; None when none is found. A folder that was named but holds no server is an error."""
    named = where or os.environ.get(ENV_VAR)
    if named:
        path = Path(named)
        binary = path / SERVER if path.is_dir() else path
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise SpecdecError(f"no executable {SERVER} in {str(path)!r} (from "
                               f"{'--llama-cpp' if where else ENV_VAR}); build llama.cpp or point at its bin folder")
        return binary
    found = shutil.which(SERVER)
    return Path(found) if found else None


def server_version(binary: str | Path) -> str | None:
    """`llama-server --version`'s line, e.g. "version: 11434 (abc123)"; None if it says nothing."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("version")]
    return lines[0].strip() if lines else None


@dataclass
class Completion:
    tokens: list[int]  # generated token ids
    seconds: float  # wall-clock time of the request, prompt processing included
    draft_n: int = 0  # tokens drafted (speculative configurations)
    draft_n_accepted: int = 0
    timings: dict = field(default_factory=dict)  # llama.cpp's own timings object

    @property
    def target_passes(self) -> int:
        """Decoding passes, counted as specdec counts them: each yields one token of the
        target's own plus the drafts it accepted."""
        return len(self.tokens) - self.draft_n_accepted


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server process on one GGUF; use as a context manager (start/stop)."""

    def __init__(self, binary: str | Path, gguf: str | Path, threads: int, ctx: int = 4096,
                 spec: str = "none", extra_args: tuple[str, ...] = (), startup_seconds: float = 120.0,
                 parallel: int = 1):
        if spec not in SPEC_ARGS:
            raise SpecdecError(f"unknown llama.cpp configuration {spec!r}; choose from {', '.join(SPEC_ARGS)}")
        self.binary, self.gguf, self.spec = Path(binary), Path(gguf), spec
        self.threads, self.ctx, self.startup_seconds = threads, ctx, startup_seconds
        self.parallel = parallel  # slots (-np): requests decoded together; each gets ctx / parallel
        self.extra_args = tuple(extra_args)  # e.g. ("-fa", "off", "-ctk", "f32", "-ctv", "f32")
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log = None  # the server's output, a temporary file while it runs

    def command(self) -> list[str]:
        return [str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
                "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.ctx), "-np", str(self.parallel),
                "--no-webui", *SPEC_ARGS[self.spec], *self.extra_args]

    def start(self) -> LlamaServer:
        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = (f"{SERVER} exited with status {self.process.returncode} while loading "
                           f"{str(self.gguf)!r}:\n{self.log_tail()}")
                self.stop()
                raise SpecdecError(message)
            try:
                if self._request("GET", "/health", timeout=2).get("status") == "ok":
                    return self
            except (OSError, SpecdecError):
                pass
            time.sleep(0.2)
        message = f"{SERVER} did not become ready within {self.startup_seconds:.0f} s:\n{self.log_tail()}"
        self.stop()
        raise SpecdecError(message)

    def stop(self) -> None:
        stop_server(self.process, self.log, timeout=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 15) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def peak_rss_bytes(self) -> int | None:
        """The server's peak resident memory (VmHWM; Linux), or None when unknown."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, AttributeError, ValueError):
            pass
        return None

    def complete(self, prompt_ids: list[int], n_predict: int, temperature: float = 0.0,
                 seed: int = 0, ignore_eos: bool = True) -> Completion:
        """Generate `n_predict` tokens after `prompt_ids`; temperature 0 is greedy. Note that
        llama.cpp's ignore_eos bans end-of-generation tokens (specdec's samples them and goes on)."""
        body = {"prompt": list(prompt_ids), "n_predict": n_predict, "temperature": temperature,
                "seed": seed, "ignore_eos": ignore_eos, "cache_prompt": False, "return_tokens": True,
                "samplers": ["temperature"], "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
                "repeat_penalty": 1.0, "n_probs": 0}
        t0 = time.perf_counter()
        out = self._request("POST", "/completion", body, timeout=600)
        seconds = time.perf_counter() - t0
        timings = out.get("timings") or {}
        return Completion(list(out.get("tokens") or []), seconds, int(timings.get("draft_n", 0)),
                          int(timings.get("draft_n_accepted", 0)), timings)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's token ids for `text` (special tokens parsed, no BOS added)."""
        out = self._request("POST", "/tokenize", {"content": text, "add_special": False, "parse_special": True})
        return list(out.get("tokens") or [])

    def _request(self, method: str, route: str, body: dict | None = None, timeout: float = 60) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{route}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise SpecdecError(f"{SERVER} answered {e.code} on {route}: {detail}") from None


def stop_server(process: subprocess.Popen | None, log, timeout: float) -> None:
    """Terminate a server process started here (kill it after `timeout` s) and delete its log file
    (its tail is in any error raised before)."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if log is not None:
        log.close()
        Path(log.name).unlink(missing_ok=True)
