"""specdec bench-serve and the server extensions it relies on (ignore_eos, continuous usage
stats), against a live batched specdec server on the tiny test model and a deliberately broken
fake server; and the server metrics the load shows (queue time, accepted length, running and
waiting requests)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_server import API_KEY, AUTH, LiveServer, one_torch_thread, parse_metrics  # noqa: E402, F401

import specdec  # noqa: E402
from specdec.bench.serve_load import Endpoint, LoadSpec, RequestRecord, run_level, summarize  # noqa: E402
from specdec.cli.main import main  # noqa: E402
from specdec.sampling import SamplingParams
from specdec.server.app import ServerSettings, create_app  # noqa: E402
from specdec.server.jobs import Job  # noqa: E402
from specdec.server.metrics import Metrics  # noqa: E402
from specdec.server.worker import EngineWorker  # noqa: E402

from helpers import make_model_dir  # noqa: E402

MODEL = "tiny"
K = 4
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("bench-serve") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir):
    """Draft = target, so drafts are accepted and one chunk often carries several tokens."""
    decoder = specdec.load(model_dir, model_dir, method="draft", draft_tokens=K)
    live = LiveServer(create_app(decoder, ServerSettings(model_name=MODEL, api_key=API_KEY, max_batch=4)))
    yield live
    live.stop()


def endpoint(server, api="completions") -> Endpoint:
    return Endpoint(server.url + "/v1/", MODEL, API_KEY, api)


# ---------------------------------------------------------------- the load and its counts

def test_every_request_answered_and_tokens_counted_from_the_stream(server):
    before = server.wait_idle()
    report, records = run_level(endpoint(server), PROMPTS, LoadSpec(max_tokens=9), concurrency=3, num_requests=7)
    after = server.wait_idle()
    assert report.requests == report.completed == 7 and report.errors == 0 and report.error_samples == []
    assert [r.prompt_index for r in records] == [j % 3 for j in range(7)]
    assert all(r.ok and r.tokens == 9 for r in records)  # ignore_eos: every request makes max_tokens
    assert report.output_tokens == 63
    assert after["specdec:generation_tokens_total"] - before["specdec:generation_tokens_total"] == 63
    # the per-chunk counts (continuous usage) add up, and speculative chunks carry several tokens:
    # counting one token per text chunk would miss them
    assert all(sum(k for _, k in r.events) == 9 for r in records)
    assert max(k for r in records for _, k in r.events) > 1
    assert report.mean_tokens_per_chunk > 1
    assert all(0 < r.ttft <= r.end - r.start for r in records)
    assert len([g for r in records for g in r.itl()]) == sum(9 - r.events[0][1] for r in records)
    assert report.tokens_per_second == pytest.approx(63 / report.wall_seconds)
    assert report.requests_per_second == pytest.approx(7 / report.wall_seconds)
    assert report.ttft_p50_ms <= report.ttft_p99_ms and report.itl_p50_ms <= report.itl_p99_ms


def test_chat_api(server):
    messages = [{"role": "user", "content": "hi"}]
    report, records = run_level(endpoint(server, "chat"), [messages, "plain text becomes a user message"],
                                LoadSpec(max_tokens=5), concurrency=2, num_requests=4)
    assert report.completed == 4 and report.output_tokens == 20
    assert all(sum(k for _, k in r.events) == 5 for r in records)


def test_errors_are_counted_not_fatal(server, model_dir):
    """A prompt longer than the tiny model's 256-token window is refused (400) every time it
    comes round; the other requests are answered."""
    too_long = "x " * 400
    report, records = run_level(endpoint(server), [PROMPTS[0], too_long], LoadSpec(max_tokens=4),
                                concurrency=2, num_requests=6)
    assert report.requests == 6 and report.errors == 3 and report.completed == 3
    assert [r.ok for r in records] == [True, False] * 3
    assert report.output_tokens == 12
    assert len(report.error_samples) == 1 and report.error_samples[0].startswith("HTTP 400")
    assert "context window" in report.error_samples[0]


def test_unreachable_server_requests_are_errors():
    report, _ = run_level(Endpoint("http://127.0.0.1:9", MODEL), PROMPTS, LoadSpec(max_tokens=2, timeout=5), 2, 3)
    assert report.errors == 3 and report.completed == 0 and report.output_tokens == 0
    assert report.tokens_per_second == 0 and report.ttft_p50_ms is None


class BrokenHandler(BaseHTTPRequestHandler):
    """prompt "cut": one chunk then the connection closes; "junk": a data line that is not JSON;
    "err": an error object in the stream; anything else: a good two-token stream."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = lambda text: f"data: {json.dumps({'choices': [{'index': 0, 'text': text}]})}\n\n".encode()
        prompt = body["prompt"]
        if prompt == "cut":
            self.wfile.write(chunk("a"))
        elif prompt == "junk":
            self.wfile.write(b"data: {not json\n\n")
        elif prompt == "err":
            self.wfile.write(b'data: {"error": {"message": "boom"}}\n\n')
        else:  # no usage at all: one token per text chunk
            self.wfile.write(chunk("a") + chunk("b") + b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def test_broken_streams_are_errors():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BrokenHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}"
        report, records = run_level(Endpoint(url, "m"), ["ok", "cut", "junk", "err"], LoadSpec(max_tokens=2), 2, 8)
    finally:
        httpd.shutdown()
    assert report.completed == 2 and report.errors == 6 and report.output_tokens == 4
    errors = {records[j].error for j in range(1, 4)}
    assert "the stream ended without [DONE]" in errors
    assert any(e.startswith("JSONDecodeError") for e in errors)
    assert any("boom" in e for e in errors)
    assert all(r.tokens == 2 and [k for _, k in r.events] == [1, 1] for r in records if r.ok)


def test_latency_arithmetic():
    r = RequestRecord(0, start=1.0, end=2.0, ok=True, tokens=6, events=[(1.2, 2), (1.5, 3), (1.6, 1)])
    assert r.ttft == pytest.approx(0.2)
    assert r.itl() == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert r.tpot == pytest.approx(0.4 / 5)
    report = summarize("t", 1, [r, RequestRecord(1, start=0.0, error="x")], wall=2.0)
    assert report.output_tokens == 6 and report.tokens_per_second == 3.0 and report.errors == 1
    assert report.itl_p50_ms == pytest.approx(100.0) and report.mean_tokens_per_chunk == 2.0


# ---------------------------------------------------------------- the command

def test_cli_against_a_running_server(server, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench-serve", "--url", server.url, "--api-key", API_KEY, "--prompt", PROMPTS[0], "--prompt",
               PROMPTS[1], "--concurrency", "1,2", "--requests", "3", "--max-tokens", "5", "--json", str(out),
               "--warmup", "0"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "tok/s" in table and "TTFT" in table
    data = json.loads(out.read_text())
    assert data["targets"][0]["model"] == MODEL  # found on /v1/models
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert all(lv["completed"] == 3 and lv["output_tokens"] == 15 and lv["errors"] == 0 for lv in data["levels"])


def test_cli_failures_exit_code(server, capsys):
    args = ["bench-serve", "--url", server.url, "--api-key", "wrong", "--model", MODEL, "--prompt", "x",
            "--concurrency", "1", "--requests", "2", "--max-tokens", "2", "--warmup", "0"]
    assert main(args) == 0  # reported, not fatal
    out = capsys.readouterr().out
    assert "0/2" in out and "HTTP 401" in out
    assert main(args + ["--fail-on-error"]) == 1


@pytest.mark.parametrize("args, message", [
    ([], "nothing to measure"),
    (["--url", "http://x", "--concurrency", "0"], "--concurrency"),
    (["--url", "http://x", "--concurrency", "1,a"], "--concurrency"),
    (["--url", "ftp://x", "--model", "m"], "http://"),
    (["--url", "http://x", "--tasks", "poems"], "unknown task"),
    (["--url", "http://x", "--max-tokens", "0"], "--max-tokens"),
    (["--url", "http://x", "--extra-body", "[1]"], "--extra-body"),
    (["--specdec-methods", "beam"], "unknown specdec method"),
    (["--llama-configs", "turbo"], "unknown llama.cpp configuration"),
    (["--llama-configs", "none", "--llama-cpp", "/nonexistent"], "no executable llama-server"),
    (["--llama-configs", "none", "--llama-cpp-gguf", "/nonexistent.gguf"], "is not a file"),
    (["--llama-configs", "draft"], "needs a draft model"),
    (["--llama-configs", "draft", "--llama-draft-gguf", "/nonexistent.gguf"], "--llama-draft-gguf"),
])
def test_bad_arguments(args, message, capsys):
    assert main(["bench-serve", "--prompt", "x", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error:") and message in err


def test_unreachable_url_is_a_clear_error(capsys):
    assert main(["bench-serve", "--url", "http://127.0.0.1:9", "--prompt", "x"]) == 2
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


# ---------------------------------------------------------------- server extensions

def test_ignore_eos(server):
    """EOS (id 0) forced first by logit_bias: the request stops at once, unless ignore_eos."""
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "logit_bias": {"0": 100}}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        stopped = c.post("/v1/completions", json=body).json()
        kept = c.post("/v1/completions", json={**body, "ignore_eos": True}).json()
        bad = c.post("/v1/completions", json={**body, "ignore_eos": "yes"})
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] == 1  # EOS
    assert kept["choices"][0]["finish_reason"] == "length" and kept["usage"]["completion_tokens"] == 6
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ignore_eos"


def test_continuous_usage_stats(server):
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0, "n": 2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
        plain = c.post("/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
    counts = [ch["usage"]["completion_tokens"] for ch in chunks]
    assert all("usage" in ch for ch in chunks)
    assert counts == sorted(counts) and counts[-1] == plain["usage"]["completion_tokens"]
    assert all(ch["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] for ch in chunks)
    without = dict(body, stream_options={"include_usage": True})
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=without) as r:
            chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert [("usage" in ch) for ch in chunks] == [False] * (len(chunks) - 1) + [True]


# ---------------------------------------------------------------- metrics

def test_metrics_accepted_length_and_queue_time(server):
    """Each finished choice adds its tokens per target pass to the histogram (the response's
    mean_accepted_length); each request adds one queue-time observation."""
    before = server.wait_idle()
    specs = []
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        for prompt in PROMPTS:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0})
            specs.append(r.json()["speculative"])
    after = server.wait_idle()
    delta = lambda name: after[name] - before.get(name, 0)
    assert delta("specdec:request_accepted_length_count") == 3
    assert delta("specdec:request_accepted_length_sum") == pytest.approx(sum(s["mean_accepted_length"] for s in specs))
    assert delta("specdec:request_accepted_length_bucket{le=\"1.0\"}") == sum(
        s["mean_accepted_length"] <= 1 for s in specs)
    assert delta("specdec:request_queue_time_seconds_count") == 3
    assert 0 <= delta("specdec:request_queue_time_seconds_sum") < 3


def test_plain_server_has_no_accepted_length(model_dir):
    live = LiveServer(create_app(specdec.load(model_dir), ServerSettings(model_name=MODEL)))
    try:
        r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200
        m = live.wait_idle()
    finally:
        live.stop()
    assert m["specdec:request_accepted_length_count"] == 0 and m["specdec:request_queue_time_seconds_count"] == 1


def test_batched_running_waiting_and_queue_time(model_dir):
    """The worker driven by hand (no thread), max_batch 2: three jobs -> two running, one
    waiting in the gauges /metrics renders; the third's queue time covers its wait."""
    decoder = specdec.load(model_dir, calibrate=False)
    metrics = Metrics()
    worker = EngineWorker(decoder, max_queue=8, metrics=metrics, max_batch=2)
    loop = asyncio.new_event_loop()
    read = lambda: parse_metrics(metrics.render().decode())
    try:
        ids = decoder.tokenizer.encode("def add")
        jobs = [Job(ids, [SamplingParams(max_new_tokens=50)], False, loop) for _ in range(3)]
        for job in jobs:
            worker.submit(job)
        assert read()["specdec:num_requests_waiting"] == 3
        worker._admit(block=False)
        m = read()
        assert m["specdec:num_requests_running"] == 2 and m["specdec:num_requests_waiting"] == 1
        assert m["specdec:request_queue_time_seconds_count"] == 2
        time.sleep(0.2)
        jobs[0].cancel()
        worker._drop_cancelled()
        worker._admit(block=False)
        m = read()
        assert m["specdec:num_requests_running"] == 2 and m["specdec:num_requests_waiting"] == 0
        assert m["specdec:request_queue_time_seconds_count"] == 3
        assert m["specdec:request_queue_time_seconds_sum"] >= 0.2  # the third waited for a slot
        for job in jobs[1:]:
            job.cancel()
        worker._drop_cancelled()
        assert read()["specdec:num_requests_running"] == 0
    finally:
        loop.close()


# ---------------------------------------------------------------- servers started by the command

def test_started_servers(model_dir, tmp_path, capsys, monkeypatch):
    """`specdec serve` started in a subprocess (and llama-server on a GGUF of the same weights
    when a llama.cpp build is found), measured one after the other."""
    from specdec.bench.llama_cpp import find_llama_server

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "r.json"
    args = ["bench-serve", "--target", str(model_dir), "--specdec-methods", "none", "--max-batch", "2",
            "--threads", "1", "--prompt", PROMPTS[0], "--concurrency", "2", "--requests", "3", "--max-tokens", "4",
            "--json", str(out)]
    llama = find_llama_server() is not None
    if llama:
        args += ["--llama-configs", "none", "--llama-parallel", "2", "--llama-ctx-per-slot", "128"]
    assert main(args) == 0
    data = json.loads(out.read_text())
    names = [t["name"] for t in data["targets"]]
    assert names == ["specdec-none b2"] + (["llama.cpp np2"] if llama else [])
    assert all(lv["completed"] == 3 and lv["output_tokens"] == 12 for lv in data["levels"])
    assert data["targets"][0]["model"] == "specdec-none"
    assert ("llama.cpp np2" in capsys.readouterr().out) == llama


def test_started_server_failure_is_reported(model_dir, capsys):
    args = ["bench-serve", "--target", str(model_dir), "--specdec-methods", "none", "--prompt", "x",
            "--serve-args", "--max-len 1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "specdec serve exited with status 2" in err and "--max-len must be >= 2" in err
