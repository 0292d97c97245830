"""A stand-in for llama.cpp's llama-server, for testing specdec's HTTP driver without a build:
the same command line, /health, /completion and /tokenize, with made-up but deterministic
answers. /completion echoes the request under "request", and generates token i as
(last prompt id + i + 1) % 50; a speculative server (--spec-type) reports half its tokens as
accepted drafts. FAKE_LLAMA_FAIL=1 in the environment makes it exit at once, as a server that
cannot load its model does."""
from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--version", action="store_true")
    p.add_argument("-m")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--spec-type")
    p.add_argument("-md")  # a draft model (--spec-type draft-simple)
    args, _ = p.parse_known_args()
    if args.version:
        print("version: 0 (fake)", file=sys.stderr)
        return 0
    if os.environ.get("FAKE_LLAMA_FAIL"):
        print(f"error: failed to load model '{args.m}'", file=sys.stderr)
        return 1
    for model in (args.m, args.md):
        with open(model or args.m, "rb") as f:
            if f.read(4) != b"GGUF":
                print(f"error: {model} is not a GGUF file", file=sys.stderr)
                return 1
    speculative = args.spec_type is not None

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"status": "ok"}) if self.path == "/health" else self._send(404, {"error": "route"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                return self._send(200, {"tokens": [ord(c) % 50 for c in body["content"]]})
            if self.path != "/completion":
                return self._send(404, {"error": "route"})
            if not body["prompt"]:
                return self._send(400, {"error": {"message": "empty prompt"}})
            n = body["n_predict"]
            tokens = [(body["prompt"][-1] + i + 1) % 50 for i in range(n)]
            timings = {"predicted_n": n, "predicted_per_second": 1000.0, "prompt_ms": 0.5 * len(body["prompt"])}
            if speculative:
                timings.update(draft_n=n, draft_n_accepted=n // 2)
            self._send(200, {"tokens": tokens, "content": "", "timings": timings, "request": body})

        def log_message(self, *a):
            pass

    HTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
