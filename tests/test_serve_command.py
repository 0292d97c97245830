"""`specdec serve` as a process: the engine loop runs in the main thread (cli/serve.py), the
HTTP server beside it; SIGTERM stops both cleanly, and a port in use is an exit status of 1."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SPECDEC = str(Path(sys.executable).with_name("specdec"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, process: subprocess.Popen, seconds: float = 60.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the server did not come up")


def test_serve_answers_stops_on_sigterm_and_reports_a_busy_port():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [SPECDEC, "serve", "--port", str(port), "--threads", "1", "--max-tokens-limit", "64"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_ready(port, process)
        body = json.dumps({"model": "pycode-target", "prompt": "def add(a, b):\n", "max_tokens": 8,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["usage"]["completion_tokens"] > 0
        busy = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert busy.returncode == 1 and "address already in use" in busy.stdout + busy.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
