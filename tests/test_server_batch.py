"""The server with --max-batch > 1 (continuous batching in the worker): concurrent clients,
streamed or not, get exactly the library's outputs; dropped clients free their slots."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_server import API_KEY, AUTH, LiveServer, one_torch_thread  # noqa: E402, F401

import specdec  # noqa: E402
from specdec.sampling import SamplingParams
from specdec.server.app import ServerSettings, create_app  # noqa: E402

from helpers import make_model_dir  # noqa: E402

MODEL = "tiny"
K = 4
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(", "héllo wörld", "x = 1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("server-batch") / "tiny")


@pytest.fixture(scope="module")
def reference(model_dir):
    return specdec.load(model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    decoder = specdec.load(model_dir, model_dir, method="draft", draft_tokens=K)
    live = LiveServer(create_app(decoder, ServerSettings(model_name=MODEL, api_key=API_KEY, max_batch=4)))
    yield live
    live.stop()


def test_concurrent_clients_get_the_library_outputs(server, reference):
    """16 clients at once (half streamed, mixed max_tokens, one with a stop string, one seeded
    with n=3) against a 4-slot batch: every choice is what the library gives alone."""
    cases = []
    for i in range(16):
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 6 + 3 * (i % 5), "temperature": 0}
        if i == 5:
            body["stop"] = [reference.generate(body["prompt"], max_new_tokens=body["max_tokens"]).text[3:5]]
        if i == 7:
            body.update(temperature=0.9, seed=11, n=3)
        if i in (3, 10):  # structured output (the grammar per sequence in the batch)
            body["response_format"] = {"type": "regex", "regex": "(yes|no|[a-z]{1,5} [0-9]{1,3})"}
        if i in (9, 12):  # batched prompts
            body["prompt"] = [PROMPTS[i % len(PROMPTS)], PROMPTS[(i + 1) % len(PROMPTS)]]
        cases.append(body)

    def want(body) -> list[str]:
        kw = dict(max_new_tokens=body["max_tokens"], temperature=body["temperature"], stop=body.get("stop"),
                  response_format=body.get("response_format"))
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        return [reference.generate(p, **kw, seed=None if "seed" not in body else body["seed"] + i).text
                for p in prompts for i in range(body.get("n", 1))]

    def one(i):
        body = cases[i]
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            if i % 2:
                texts = [""] * body.get("n", 1) * (len(body["prompt"]) if isinstance(body["prompt"], list) else 1)
                with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                assert lines[-1] == "data: [DONE]"
                for ln in lines[:-1]:
                    choice = json.loads(ln[6:])["choices"][0]
                    texts[choice["index"]] += choice["text"]
                return texts
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return [ch["text"] for ch in sorted(r.json()["choices"], key=lambda ch: ch["index"])]

    before = server.wait_idle()
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(16)))
    assert got == [want(body) for body in cases]
    after = server.wait_idle()
    steps = after["specdec:batch_size_count"] - before.get("specdec:batch_size_count", 0)
    sequences = after["specdec:batch_size_sum"] - before.get("specdec:batch_size_sum", 0)
    assert steps > 0 and sequences / steps > 1.5  # the steps really were shared


def test_dropped_streams_free_their_slots(server, reference):
    before = server.wait_idle()
    body = {"model": MODEL, "prompt": "x = 1", "max_tokens": 200, "temperature": 0, "stream": True}

    def drop(_):
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                next(r.iter_raw())  # the first chunk, then hang up

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(drop, range(24)))
    t0 = time.monotonic()
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=5) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200 and time.monotonic() - t0 < 5
    assert r.json()["choices"][0]["text"] == reference.generate(PROMPTS[0], max_new_tokens=12).text
    after = server.wait_idle(5)
    assert after["specdec:requests_cancelled_total"] - before["specdec:requests_cancelled_total"] >= 20
    generated = after["specdec:generation_tokens_total"] - before["specdec:generation_tokens_total"]
    assert generated < 24 * 200 / 2
    assert len(server.app.state.server.worker.batch) == 0  # every slot is free again


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_tree_methods_are_batched(model_dir, reference, tmp_path, method):
    """A Medusa or EAGLE server with --max-batch: 8 concurrent clients (greedy and seeded)
    against a 4-slot batch get what the library gives alone."""
    from helpers import make_eagle_dir, make_medusa_dir

    make_dir = make_medusa_dir if method == "medusa" else make_eagle_dir
    decoder = specdec.load(model_dir, make_dir(tmp_path / method, model_dir), method=method, draft_tokens=6)
    live = LiveServer(create_app(decoder, ServerSettings(model_name=MODEL, api_key=API_KEY, max_batch=4)))
    try:
        bodies = [{"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8 + 3 * i,
                   "temperature": 0 if i % 2 else 0.8, "seed": 5 + i} for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda b: httpx.post(f"{live.url}/v1/completions", json=b, headers=AUTH,
                                                         timeout=60), bodies))
        for body, answer in zip(bodies, answers):
            assert answer.status_code == 200, answer.text
            want = reference.generate(body["prompt"], max_new_tokens=body["max_tokens"],
                                      temperature=body["temperature"], seed=body["seed"]).text
            assert answer.json()["choices"][0]["text"] == want
    finally:
        live.stop()


def test_serve_cli_max_batch(capsys):
    from specdec.cli.main import build_parser, main

    assert build_parser().parse_args(["serve"]).max_batch == 1
    assert build_parser().parse_args(["serve", "--max-batch", "8"]).max_batch == 8
    assert main(["serve", "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err


def test_full_batch_leaves_jobs_queued(model_dir):
    """A job leaves the queue only when a slot is free and the jobs before it have all their
    choices in the batch, so a full batch lets the queue fill (and the server answer 429)."""
    import asyncio

    from specdec.server.jobs import Job, QueueFull
    from specdec.server.metrics import Metrics
    from specdec.server.worker import EngineWorker

    decoder = specdec.load(model_dir, calibrate=False)
    worker = EngineWorker(decoder, max_queue=1, metrics=Metrics(), max_batch=2)
    loop = asyncio.new_event_loop()
    try:
        ids = decoder.tokenizer.encode("def add")
        first = Job(ids, [SamplingParams(max_new_tokens=50)] * 3, False, loop)  # n = 3 choices
        second = Job(ids, [SamplingParams(max_new_tokens=50)], False, loop)
        worker.submit(first)
        worker._admit(block=False)
        assert len(worker.batch) == 2 and len(worker._jobs[0].waiting) == 1
        worker.submit(second)
        with pytest.raises(QueueFull):
            worker.submit(Job(ids, [SamplingParams()], False, loop))
        worker._deliver(worker.batch.step())
        worker._admit(block=False)
        assert worker.queue.qsize() == 1  # no free slot: the second job still waits
        first.cancel()
        worker._drop_cancelled()
        worker._admit(block=False)
        assert worker.queue.qsize() == 0 and len(worker.batch) == 1 and worker._jobs[0].job is second
    finally:
        loop.close()


def test_jobs_cancelled_while_queued_free_their_places(model_dir):
    """A client that leaves while its job waits must not keep its place: the waiting gauge
    counts live jobs only, and a new job finding the queue full of abandoned ones gets in
    (they end, counted as cancelled) instead of a 429."""
    import asyncio

    from specdec.server.jobs import Job, QueueFull
    from specdec.server.metrics import Metrics
    from specdec.server.worker import EngineWorker

    decoder = specdec.load(model_dir, calibrate=False)
    metrics = Metrics()
    worker = EngineWorker(decoder, max_queue=2, metrics=metrics, max_batch=2)

    def value(metric) -> float:
        return metric.collect()[0].samples[0].value

    loop = asyncio.new_event_loop()
    try:
        ids = decoder.tokenizer.encode("def add")
        for _ in range(2):  # the batch is full
            worker.submit(Job(ids, [SamplingParams(max_new_tokens=50)], False, loop))
        worker._admit(block=False)
        gone = [Job(ids, [SamplingParams(max_new_tokens=50)], True, loop) for _ in range(2)]
        for job in gone:
            worker.submit(job)
        gone[0].cancel()
        assert value(metrics.num_requests_waiting) == 1 and worker.queue.qsize() == 2
        gone[1].cancel()
        fresh = Job(ids, [SamplingParams(max_new_tokens=5)], False, loop)
        worker.submit(fresh)  # both abandoned jobs leave the queue
        assert list(worker.queue.queue) == [fresh]
        assert value(metrics.requests_cancelled) == 2
        worker.submit(Job(ids, [SamplingParams()], False, loop))
        with pytest.raises(QueueFull):  # live jobs still fill it
            worker.submit(Job(ids, [SamplingParams()], False, loop))
        loop.run_until_complete(asyncio.sleep(0))  # deliver the posted events
        assert all(job.events.get_nowait().kind == "end" for job in gone)
    finally:
        loop.close()


def _hang_up_after_sending(port: int, body: dict) -> None:
    """Write a whole request on a raw socket and close it before reading anything."""
    import socket

    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head + payload)


def test_random_disconnects_leave_no_slot_and_mix_nothing(server, reference):
    """scripts/disconnect_load.py in small: 40 streamed requests from 8 clients on a 4-slot
    batch (greedy and seeded, some n=2), half hanging up right after sending, before the
    first token or mid-stream: afterwards no job, queued job or slot is left, a fresh request
    is answered at once, and every completed response is what the library gives alone."""
    import random

    rng = random.Random(7)
    cases = []
    for i in range(40):
        drop = rng.choice(["sent", "headers", "mid"]) if i % 2 else None
        # a request that hangs up is long enough not to finish before the hang-up is seen (short
        # ones could, on a fast machine or an idle one, and would not count as cancelled)
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)],
                "max_tokens": rng.randint(48, 64) if drop else rng.randint(4, 40), "temperature": 0, "stream": True}
        if i % 3 == 1:
            body.update(temperature=0.9, seed=rng.randrange(1000))
        if i % 7 == 3:
            body["n"] = 2
        cases.append((body, drop))

    def one(case):
        body, drop = case
        if drop == "sent":
            _hang_up_after_sending(server.port, body)
            return None
        texts = [""] * body.get("n", 1)
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                if drop == "headers":
                    return None
                for n, line in enumerate(ln for ln in r.iter_lines() if ln.startswith("data: {")):
                    if drop == "mid" and n == 2:
                        return None
                    choice = json.loads(line[6:])["choices"][0]
                    texts[choice["index"]] += choice["text"]
        return texts

    def want(body) -> list[str]:
        seed = body.get("seed")
        return [reference.generate(body["prompt"], max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                                   seed=None if seed is None else seed + i).text for i in range(body.get("n", 1))]

    before = server.wait_idle()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, cases))
    t0 = time.monotonic()
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=5) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and time.monotonic() - t0 < 2
    after = server.wait_idle(5)
    assert after["specdec:batch_slots_used"] == 0 and len(server.app.state.server.worker.batch) == 0
    assert not server.app.state.server.worker._jobs and server.app.state.server.worker.queue.qsize() == 0
    assert after["specdec:requests_cancelled_total"] - before["specdec:requests_cancelled_total"] >= 10
    completed = [(case[0], texts) for case, texts in zip(cases, got) if texts is not None]
    assert len(completed) >= 20
    assert [texts for _, texts in completed] == [want(body) for body, _ in completed]
