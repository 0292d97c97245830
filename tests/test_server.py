"""The OpenAI-compatible server, end to end against live uvicorn servers on 127.0.0.1."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
import uvicorn  # noqa: E402

import specdec  # noqa: E402
from specdec.chat.template import DEFAULT_TEMPLATE, ChatTemplate, ChatTemplateError  # noqa: E402
from specdec.sampling import SAMPLING_BOUNDS  # noqa: E402
from specdec.sampling.logprobs import token_texts  # noqa: E402
from specdec.server.app import ServerSettings, create_app  # noqa: E402
from specdec.server.metrics import accepted_per_position  # noqa: E402

from helpers import make_model_dir  # noqa: E402

API_KEY = "test-key"
MODEL = "tiny"
N = 12  # max_tokens for most requests
K = 4  # fixed draft length: seeded sampling is then reproducible
LIMIT = 200  # --max-tokens-limit of the main server
PROMPT = "def add(a, b):"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


# ---------------------------------------------------------------- live servers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, app):
        self.app = app
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def metrics(self, headers=AUTH) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        return parse_metrics(text)

    def wait_idle(self, timeout: float = 10.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["specdec:num_requests_running"] == 0 and m["specdec:num_requests_waiting"] == 0:
                return m
            assert time.monotonic() < deadline, f"server still busy: {m}"
            time.sleep(0.05)


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """On a small, busy CPU torch's thread pool is far slower than one thread (it spins);
    restored after this module."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("server") / "tiny")


@pytest.fixture(scope="module")
def reference(model_dir):
    """A separately loaded plain decoder: greedy output is what the server must return."""
    return specdec.load(model_dir)


@pytest.fixture(scope="module")
def draft_reference(model_dir):
    """Same configuration as the server: seeded sampling must match it exactly."""
    return specdec.load(model_dir, model_dir, method="draft", draft_tokens=K)


@pytest.fixture(scope="module")
def server(model_dir):
    decoder = specdec.load(model_dir, model_dir, method="draft", draft_tokens=K)
    live = LiveServer(create_app(decoder, ServerSettings(model_name=MODEL, api_key=API_KEY,
                                                         max_tokens_limit=LIMIT)))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


def greedy(reference, prompt, max_tokens=N, **kw):
    return reference.generate(prompt, temperature=0, max_new_tokens=max_tokens, **kw)


def chat_prompt(messages) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


# ---------------------------------------------------------------- OpenAI client

def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = httpx.get(f"{server.url}/health")  # no key needed
    assert r.status_code == 200 and r.json()["status"] == "ok"
    card = httpx.get(f"{server.url}/v1/models/{MODEL}", headers=AUTH).json()
    assert card["id"] == MODEL and card["max_model_len"] == 256 and card["speculative_method"] == "draft"


def test_completion_greedy_matches_library(client, reference):
    want = greedy(reference, PROMPT)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert resp.object == "text_completion" and resp.model == MODEL and resp.id.startswith("cmpl-")
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.text == want.text and choice.finish_reason == want.finish_reason
    assert choice.index == 0 and choice.logprobs is None
    assert resp.usage.prompt_tokens == len(reference.tokenizer.encode(PROMPT))
    assert resp.usage.completion_tokens == len(want.token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    spec = resp.model_extra["speculative"]
    assert spec["method"] == "draft"
    assert 0 < spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"])
    assert spec["mean_accepted_length"] > 1


def test_fingerprint_and_usage_details(client, http):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert resp.system_fingerprint == f"specdec-{specdec.__version__}-draft"
    details = resp.usage.completion_tokens_details
    spec = resp.model_extra["speculative"]
    assert details.accepted_prediction_tokens == spec["accepted_tokens"] > 0
    assert details.rejected_prediction_tokens == spec["drafted_tokens"] - spec["accepted_tokens"]
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # all but the last
    assert again.choices[0].text == resp.choices[0].text
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, stream=True))
    assert {c.system_fingerprint for c in chunks} == {f"specdec-{specdec.__version__}-draft"}


def test_completion_prompt_forms(client, reference):
    want = greedy(reference, PROMPT).text
    ids = reference.tokenizer.encode(PROMPT)
    for prompt in ([PROMPT], ids, [ids]):
        resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0)
        assert resp.choices[0].text == want


def test_completion_stream(client, reference):
    want = greedy(reference, PROMPT)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want.text
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [want.finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(want.token_ids)
    assert last.model_extra["speculative"]["method"] == "draft"


def test_completion_stop(client, reference):
    full = greedy(reference, PROMPT, 24).text
    stop = full[5:8]
    want = greedy(reference, PROMPT, 24, stop=(stop,))
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert resp.choices[0].text == want.text and resp.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert streamed == want.text


def test_chat_greedy_and_stream(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def add"}]
    want = greedy(reference, chat_prompt(messages))
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    msg = resp.choices[0].message
    assert msg.role == "assistant" and msg.content == want.text
    assert resp.choices[0].finish_reason == want.finish_reason
    assert resp.usage.prompt_tokens == len(reference.tokenizer.encode(chat_prompt(messages)))

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=N,
                                                 temperature=0, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    assert chunks[-1].model_extra["speculative"]["method"] == "draft"


def test_n_and_seed(client, draft_reference):
    results = [draft_reference.generate(PROMPT, temperature=1.0, top_k=50, max_new_tokens=N, seed=7 + i)
               for i in range(3)]
    want = [r.text for r in results]
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=1.0,
                                     extra_body={"top_k": 50}, n=3, seed=7)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.text for c in resp.choices] == want
    assert resp.usage.completion_tokens == sum(len(r.token_ids) for r in results)

    messages = [{"role": "user", "content": "class Point:"}]
    want = [draft_reference.generate(chat_prompt(messages), temperature=0.8, top_p=0.9, max_new_tokens=N,
                                     seed=3 + i).text for i in range(2)]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0.8,
                                          top_p=0.9, n=2, seed=3)
    assert [c.message.content for c in resp.choices] == want
    texts = ["", ""]
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N,
                                                temperature=0.8, top_p=0.9, n=2, seed=3, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == want


def test_batched_prompts(client, http, draft_reference):
    """A list of prompts: prompt p's i-th choice has index p * n + i (OpenAI's numbering) and is
    what the library gives that prompt with seed + i; usage sums the prompts once each."""
    ids = draft_reference.tokenizer.encode("import os")
    prompts = [PROMPT, "class Stack:", ids]
    n, seed = 2, 11
    want = [draft_reference.generate(p, temperature=1.0, top_k=50, max_new_tokens=N, seed=seed + i)
            for p in prompts for i in range(n)]
    for as_ids in (False, True):  # strings, or every prompt as token ids
        sent = [draft_reference.tokenizer.encode(p) if as_ids and isinstance(p, str) else p for p in prompts]
        if not as_ids:
            sent[2] = "import os"
        resp = client.completions.create(model=MODEL, prompt=sent, max_tokens=N, temperature=1.0,
                                         extra_body={"top_k": 50}, n=n, seed=seed)
        assert [c.index for c in resp.choices] == list(range(len(prompts) * n))
        assert [c.text for c in resp.choices] == [r.text for r in want]
        assert resp.usage.prompt_tokens == sum(len(draft_reference.tokenizer.encode(p)) if isinstance(p, str)
                                               else len(p) for p in prompts)
        assert resp.usage.completion_tokens == sum(len(r.token_ids) for r in want)
    texts = [""] * len(want)
    for chunk in client.completions.create(model=MODEL, prompt=prompts[:2], max_tokens=N, temperature=1.0,
                                           extra_body={"top_k": 50}, n=n, seed=seed, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[:4] == [r.text for r in want[:4]]
    # echo: each choice starts with its own prompt; logprobs offsets count from that prompt
    body = {"prompt": [PROMPT, "class Stack:"], "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1}
    choices = http.post("/v1/completions", json=body).json()["choices"]
    assert [c["text"][:len(p)] for c, p in zip(choices, body["prompt"])] == body["prompt"]
    assert choices[1]["logprobs"]["text_offset"][0] == 0
    assert choices[1]["logprobs"]["tokens"][0] == draft_reference.tokenizer.decode(
        draft_reference.tokenizer.encode("class Stack:")[:1])


JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                                "n": {"type": "integer", "minimum": 0, "maximum": 99}},
               "required": ["name", "n"], "additionalProperties": False}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": JSON_SCHEMA, "strict": True}}


def test_response_format(client, http, reference):
    """Both endpoints: the library's constrained greedy output (the server speculates with a
    draft), parsed JSON that fits the schema, also streamed; json_object and regex too."""
    pytest.importorskip("llguidance")
    want = greedy(reference, PROMPT, 40, response_format=SCHEMA_FORMAT)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                     extra_body={"response_format": SCHEMA_FORMAT})
    assert resp.choices[0].text == want.text and resp.choices[0].finish_reason == "stop"
    assert set(json.loads(want.text)) == {"name", "n"}
    messages = [{"role": "user", "content": "a thing, as JSON"}]
    want = greedy(reference, chat_prompt(messages), 40, response_format=SCHEMA_FORMAT)
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                          response_format=SCHEMA_FORMAT)
    assert resp.choices[0].message.content == want.text and set(json.loads(want.text)) == {"name", "n"}
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, temperature=0, response_format=SCHEMA_FORMAT, stream=True)
        if c.choices)
    assert text == want.text
    for seed in range(3):  # sampled
        resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=1.0,
                                              seed=seed, response_format=SCHEMA_FORMAT)
        assert set(json.loads(resp.choices[0].message.content)) == {"name", "n"}
    obj = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "temperature": 0,
                                                  "response_format": {"type": "json_object"}}).json()
    assert obj["choices"][0]["message"]["content"].startswith("{")
    obj = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                             "response_format": {"type": "regex", "regex": "(yes|no)"}}).json()
    assert obj["choices"][0]["text"] in ("yes", "no")


TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    """A server whose tiny model has room for the tool prompt (~1000 tokens of its small BPE)."""
    folder = make_model_dir(tmp_path_factory.mktemp("tools") / "tiny", max_pos=1536)
    live = LiveServer(create_app(specdec.load(folder, folder, method="draft", draft_tokens=K),
                                 ServerSettings(model_name=MODEL, api_key=API_KEY)))
    yield live, specdec.load(folder)
    live.stop()


def test_tools(tool_server):
    """tool_choice required / named: the reply is the library's constrained greedy output on the
    prompt with the tool prompt, parsed into tool_calls (finish_reason tool_calls), also streamed;
    parallel_tool_calls=false gives one call; tool results and earlier calls are accepted."""
    pytest.importorskip("llguidance")
    from specdec.chat.tools import Tool, ToolSettings, call_grammar, parse_calls, render_messages

    server, reference = tool_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    http = httpx.Client(base_url=server.url, headers=AUTH, timeout=60)

    settings = ToolSettings(tuple(Tool(t["function"]["name"], t["function"].get("description", ""),
                                       t["function"]["parameters"]) for t in TOOLS), "required")
    messages = [{"role": "user", "content": "what time is it in utc?"}]
    want = greedy(reference, chat_prompt(render_messages(messages, settings, False)), 120,
                  grammar=call_grammar(settings))
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120, temperature=0,
                                          tools=TOOLS, tool_choice="required")
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and {c.function.name for c in calls} <= {"get_time", "add"}
    _, want_calls = parse_calls(want.text, settings)  # the library's greedy reply, parsed
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in want_calls] == \
        [(c.function.name, c.function.arguments) for c in calls]
    for c in calls:
        args = json.loads(c.function.arguments)
        assert set(args) == ({"zone"} if c.function.name == "get_time" else {"a", "b"})
    with client.chat.completions.stream(model=MODEL, messages=messages, max_tokens=120, temperature=0,
                                        tools=TOOLS, tool_choice="required") as stream:  # the client's helper
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and not final.message.content
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in calls]

    named = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120, temperature=0,
                                           tools=TOOLS, parallel_tool_calls=False,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["add"]

    history = messages + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function", "function": {"name": calls[0].function.name,
                                                             "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "12:00"}]
    want = greedy(reference, chat_prompt(render_messages(
        [{"role": m["role"], "content": m["content"] or "", **({"tool_calls": m["tool_calls"]} if "tool_calls" in m
                                                                else {})} for m in history],
        ToolSettings(settings.tools, "none"), False)), N)
    resp = http.post("/v1/chat/completions", json={"messages": history, "max_tokens": N, "temperature": 0,
                                                   "tools": TOOLS, "tool_choice": "none"}).json()
    assert resp["choices"][0]["message"] == {"role": "assistant", "content": want.text}
    auto = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": N, "temperature": 0,
                                                   "tools": TOOLS}).json()["choices"][0]
    assert auto["finish_reason"] in ("stop", "length") and "tool_calls" not in auto["message"]  # a random model



def sse_objects(http, body: dict) -> list[dict]:
    """The JSON objects of a streamed response, as sent."""
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_tool_calls_stream_as_they_are_written(tool_server):
    """Streamed with tools (sampled, seeded: the same reply as without stream): per call a first
    delta {index, id, type, function: {name, arguments: ""}}, then fragments {index, function:
    {arguments}} that join into the non-streamed arguments; calls at indices 0, 1, ...; no
    content; the last choice chunk finish_reason tool_calls (the engine's when the calls were
    cut short)."""
    pytest.importorskip("llguidance")
    server, _ = tool_server
    http = httpx.Client(base_url=server.url, headers=AUTH, timeout=60)
    messages = [{"role": "user", "content": "what time is it in utc?"}]
    most = 0
    for seed in range(4):
        body = {"messages": messages, "max_tokens": 400, "temperature": 1.0, "seed": seed, "tools": TOOLS,
                "tool_choice": "required"}
        want = http.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert want["finish_reason"] == "tool_calls", want
        want_calls = want["message"]["tool_calls"]
        choices = [o["choices"][0] for o in sse_objects(http, {**body, "stream": True}) if o["choices"]]
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["tool_calls"]
        assert all(not c["delta"].get("content") for c in choices)
        calls = [c["delta"]["tool_calls"] for c in choices if "tool_calls" in c["delta"]]
        assert all(len(d) == 1 for d in calls)
        calls = [d[0] for d in calls]
        firsts = [c for c in calls if "id" in c]
        assert [(c["index"], c["type"], c["function"]) for c in firsts] == \
            [(j, "function", {"name": w["function"]["name"], "arguments": ""}) for j, w in enumerate(want_calls)]
        assert len({c["id"] for c in firsts}) == len(firsts) and all(c["id"].startswith("call_") for c in firsts)
        for j, w in enumerate(want_calls):
            fragments = [c for c in calls if c["index"] == j and "id" not in c]
            assert all(c == {"index": j, "function": {"arguments": c["function"]["arguments"]}} for c in fragments)
            assert len(fragments) > 1  # written as it grows, not in one piece
            assert "".join(c["function"]["arguments"] for c in fragments) == w["function"]["arguments"]
            assert calls.index(firsts[j]) < calls.index(fragments[0])
        most = max(most, len(want_calls))
    assert most >= 2  # some reply called tools in parallel
    body = {**body, "max_tokens": 60, "seed": 1}  # cut short in a call: no call in the message,
    assert http.post("/v1/chat/completions", json=body).json()["choices"][0]["finish_reason"] == "length"
    choices = [o["choices"][0] for o in sse_objects(http, {**body, "stream": True}) if o["choices"]]
    assert choices[-1]["finish_reason"] == "length"  # the stream cannot take back the deltas it sent
    firsts = [c["delta"]["tool_calls"][0] for c in choices if "id" in c["delta"].get("tool_calls", [{}])[0]]
    assert firsts and firsts[0]["index"] == 0 and all(not c["delta"].get("content") for c in choices)


def test_a_seed_gives_plain_decodings_output_whatever_the_method(client, reference, draft_reference):
    """Seeded drafter-invariant sampling (the default with a seed): the draft server returns
    what plain decoding returns for that seed; seed_mode "rejection" keeps rejection sampling."""
    plain = [reference.generate(PROMPT, temperature=1.0, max_new_tokens=N, seed=11 + i).text for i in range(3)]
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=1.0, n=3, seed=11)
    assert [c.text for c in resp.choices] == plain
    rejection = draft_reference.generate(PROMPT, temperature=1.0, max_new_tokens=N, seed=11, seed_mode="rejection")
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=1.0, seed=11,
                                     extra_body={"seed_mode": "rejection"})
    assert resp.choices[0].text == rejection.text


# ---------------------------------------------------------------- logprobs, echo, penalties

def _close(got: list, want: list) -> bool:
    return len(got) == len(want) and all(abs(a - b) < 1e-4 for a, b in zip(got, want))


def shown(reference, token: int) -> str:
    """A token as the API shows it: its text, or "bytes:\\x.." when it is not whole UTF-8
    (token bytes are checked against the tokenizer in test_logprobs.py)."""
    data = token_texts(reference.tokenizer).token_bytes(token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def test_chat_logprobs_match_the_library(client, http, reference):
    """Every token's logprob (the target's, through a draft-model server) and its top
    alternatives; bytes rebuild the text; streamed chunks carry the same entries."""
    messages = [{"role": "user", "content": "def add"}]
    want = greedy(reference, chat_prompt(messages), logprobs=3)
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert resp.choices[0].message.content == want.text
    assert _close([c.logprob for c in content], [e.logprob for e in want.token_logprobs])
    assert b"".join(bytes(c.bytes) for c in content).decode() == want.text
    for c, e in zip(content, want.token_logprobs):
        assert [t.token for t in c.top_logprobs] == [shown(reference, t) for t, _ in e.top]
        assert _close([t.logprob for t in c.top_logprobs], [lp for _, lp in e.top])
        assert c.token == c.top_logprobs[0].token  # greedy: the chosen token is the most likely
    body = {"messages": messages, "max_tokens": N, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert streamed == http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    assert len(streamed) == len(want.token_ids)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                           logprobs=True)
    assert plain.choices[0].logprobs.content[0].top_logprobs == []  # top_logprobs defaults to 0


def test_completion_logprobs_and_echo(http, reference):
    ids = reference.tokenizer.encode(PROMPT)
    want = greedy(reference, PROMPT, logprobs=2, prompt_logprobs=2)
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": 2}
    lp = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == [shown(reference, t) for t in want.token_ids]
    assert _close(lp["token_logprobs"], [e.logprob for e in want.token_logprobs])
    # offsets count from the start of the prompt; each top_logprobs holds the 2 best and the chosen one
    assert lp["text_offset"][0] == len(PROMPT)
    for i, offset in enumerate(lp["text_offset"]):  # where the text so far is whole characters
        before = reference.tokenizer.decode(want.token_ids[:i])
        if "\ufffd" not in before:
            assert offset == len(PROMPT) + len(before)
    for top, e in zip(lp["top_logprobs"], want.token_logprobs):
        names = [shown(reference, t) for t, _ in e.top]
        assert list(top) == names + ([] if e.token in [t for t, _ in e.top] else [shown(reference, e.token)])
        assert _close(list(top.values())[:2], [lp for _, lp in e.top])

    echoed = http.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]
    assert echoed["text"] == PROMPT + want.text
    lp = echoed["logprobs"]
    assert lp["tokens"] == [shown(reference, t) for t in ids + want.token_ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:len(ids)] == [len(reference.tokenizer.decode(ids[:i])) for i in range(len(ids))]
    prompt_part = lp["token_logprobs"][1:len(ids)]
    assert _close(prompt_part, [e.logprob for e in want.prompt_logprobs[1:]])
    assert _close(lp["token_logprobs"][len(ids):], [e.logprob for e in want.token_logprobs])
    assert lp["text_offset"][len(ids)] == len(PROMPT)
    assert http.post("/v1/completions", json={**body, "logprobs": None, "echo": True}).json()["choices"][0][
        "text"] == PROMPT + want.text

    with http.stream("POST", "/v1/completions", json={**body, "echo": True, "stream": True}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["text"] == PROMPT and "".join(c["text"] for c in choices) == PROMPT + want.text
    joined = {key: [x for c in choices if c["logprobs"] for x in c["logprobs"][key]] for key in lp}
    assert joined == lp


def test_openai_client_reads_completion_logprobs(client, reference):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True)
    lp = resp.choices[0].logprobs
    assert resp.choices[0].text.startswith(PROMPT)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])
    # n = 2, streamed: each choice echoes the prompt and gets its own logprobs, in order
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=4, n=2,
                                      logprobs=0, echo=True)
    texts, tokens = ["", ""], [[], []]
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=4, n=2,
                                           logprobs=0, echo=True, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            tokens[c.index] += c.logprobs.tokens if c.logprobs else []
    assert texts == [c.text for c in whole.choices] and all(t.startswith(PROMPT) for t in texts)
    assert tokens == [c.logprobs.tokens for c in whole.choices]


def test_penalties_and_logit_bias_match_the_library(client, http, reference):
    """Through the speculative server, greedy output with penalties is the library's plain
    greedy output with the same penalties; +100 forces a token, -100 bans it."""
    messages = [{"role": "user", "content": "for i in range(10):"}]
    kw = dict(presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3)
    want = greedy(reference, chat_prompt(messages), 24, **kw)
    assert want.token_ids != greedy(reference, chat_prompt(messages), 24).token_ids  # the penalties matter
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                          presence_penalty=1.5, frequency_penalty=0.5,
                                          extra_body={"repetition_penalty": 1.3})
    assert resp.choices[0].message.content == want.text
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, presence_penalty=1.5, frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.3}, stream=True))
    assert streamed == want.text

    plain = greedy(reference, PROMPT, 6).token_ids
    forced = reference.tokenizer.encode(" x")[-1]
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0.9, "seed": 1,
                                           "logit_bias": {str(forced): 100}}).json()
    assert r["usage"]["completion_tokens"] == 6 and r["choices"][0]["text"] == reference.tokenizer.decode([forced] * 6)
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                                           "logit_bias": {str(plain[0]): -100}}).json()
    assert r["choices"][0]["logprobs"]["tokens"][0] != shown(reference, plain[0])
    assert r["choices"][0]["text"] == greedy(reference, PROMPT, 6, logit_bias={plain[0]: -100}).text


def test_chat_template_from_tokenizer_config():
    template = ChatTemplate.from_tokenizer_config({
        "bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
                         "{{ raise_exception('no tools') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}"
                         "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"})
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>[user]hi</s>[assistant]"
    with pytest.raises(ChatTemplateError, match="no tools"):
        template.render([{"role": "tool", "content": "x"}])
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        sandboxed.render([])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    default = ChatTemplate.from_tokenizer_config({})
    assert default.render(messages) == chat_prompt(messages) == "system: be brief\nuser: hi\nassistant: "
    assert ChatTemplate(DEFAULT_TEMPLATE).render(messages) == default.render(messages)


def test_server_uses_the_models_chat_template(model_dir, tmp_path):
    import shutil

    folder = shutil.copytree(model_dir, tmp_path / "chat-model")
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                            "{% if messages[-1]['role'] == 'system' %}{{ raise_exception('end with a user "
                            "message') }}{% endif %}<assistant>")
    cfg_path.write_text(json.dumps(cfg))
    decoder = specdec.load(folder)
    app = create_app(decoder)
    try:
        parser = app.state.server.parser
        req = parser.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert req.prompt_ids == decoder.tokenizer.encode("<user>hi<assistant>")
        with pytest.raises(Exception) as e:
            parser.chat({"messages": [{"role": "system", "content": "hi"}]})
        assert e.value.status == 400 and "end with a user message" in e.value.message
        with pytest.raises(Exception) as e:  # never a template from the request
            parser.chat({"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 7 }}"})
        assert e.value.status == 400 and e.value.param == "chat_template"
    finally:
        app.state.server.worker.stop()


# ---------------------------------------------------------------- bad input

BIG = "x" * 100  # 100 tokens
BAD = [
    # (route, body, status, words the message must contain, param)
    ("completions", {"prompt": "a", "temperature": -1}, 400, "temperature", "temperature"),
    ("completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature", "temperature"),
    ("completions", {"prompt": "a", "temperature": True}, 400, "temperature", "temperature"),
    ("completions", b'{"prompt": "a", "temperature": 1e400}', 400, "temperature", "temperature"),
    ("completions", b'{"prompt": "a", "temperature": -Infinity}', 400, "temperature", "temperature"),
    ("completions", {"prompt": "a", "temperature": 10 ** 400}, 400, "temperature", "temperature"),
    ("completions", {"prompt": "a", "top_p": 0}, 400, "top_p", "top_p"),
    ("completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p", "top_p"),
    ("completions", {"prompt": "a", "top_k": -1}, 400, "top_k", "top_k"),
    ("completions", {"prompt": "a", "top_k": 1.5}, 400, "top_k", "top_k"),
    ("completions", {"prompt": "a", "min_p": -0.1}, 400, "min_p", "min_p"),
    ("completions", {"prompt": "a", "min_p": 2}, 400, "min_p", "min_p"),
    ("completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    ("completions", {"prompt": "a", "max_tokens": "1"}, 400, "max_tokens", "max_tokens"),
    ("completions", {"prompt": "a", "max_tokens": False}, 400, "max_tokens", "max_tokens"),
    ("completions", {"prompt": "a", "max_tokens": LIMIT + 1}, 400, str(LIMIT), "max_tokens"),
    ("completions", {"prompt": BIG, "max_tokens": 190}, 400, "context window", "max_tokens"),
    ("completions", {"prompt": "x" * 2000}, 400, "context window", "prompt"),
    ("completions", {"prompt": ""}, 400, "empty", "prompt"),
    ("completions", {"prompt": []}, 400, "empty", "prompt"),
    ("completions", {"prompt": ["a", ""]}, 400, "prompt[1] must not be empty", "prompt"),
    ("completions", {"prompt": [[1], []]}, 400, "prompt[1] must not be empty", "prompt"),
    ("completions", {"prompt": [[1], "a"]}, 400, "mixture", "prompt"),
    ("completions", {"prompt": [[1], [10 ** 9]]}, 400, "prompt[1] token ids", "prompt"),
    ("completions", {"prompt": ["a"] * 17}, 400, "at most 16", "prompt"),
    ("completions", {"prompt": [1, "a"]}, 400, "token ids", "prompt"),
    ("completions", {"prompt": [10 ** 9]}, 400, "token ids", "prompt"),
    ("completions", {"prompt": 5}, 400, "prompt", "prompt"),
    ("completions", {"max_tokens": 4}, 400, "prompt", "prompt"),
    ("completions", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "stop"),
    ("completions", {"prompt": "a", "stop": ["x" * 1001]}, 400, "at most 1000", "stop"),
    ("completions", {"prompt": "a", "stop": ""}, 400, "stop", "stop"),
    ("completions", {"prompt": "a", "stop": ["a", ""]}, 400, "stop", "stop"),
    ("completions", {"prompt": "a", "stop": 3}, 400, "stop", "stop"),
    ("completions", {"prompt": "a", "n": 0}, 400, "n must", "n"),
    ("completions", {"prompt": "a", "n": 9}, 400, "n must", "n"),
    ("completions", {"prompt": "a", "seed": "1"}, 400, "seed", "seed"),
    ("completions", {"prompt": "a", "seed": 2 ** 70}, 400, "seed", "seed"),
    ("completions", {"prompt": "a", "stream": "yes"}, 400, "stream", "stream"),
    ("completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream",
     "stream_options"),
    ("completions", {"prompt": "a", "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "include_usage", "include_usage"),
    ("completions", {"prompt": "a", "user": 5}, 400, "user", "user"),
    ("completions", {"prompt": "a", "model": 5}, 400, "model", "model"),
    ("completions", {"prompt": "a", "logprobs": 21}, 400, "logprobs", "logprobs"),
    ("completions", {"prompt": "a", "logprobs": True}, 400, "logprobs", "logprobs"),
    ("completions", {"prompt": "a", "top_logprobs": 2}, 400, "top_logprobs", "top_logprobs"),
    ("completions", {"prompt": "a", "echo": 1}, 400, "echo", "echo"),
    ("completions", {"prompt": "a", "presence_penalty": 2.5}, 400, "presence_penalty", "presence_penalty"),
    ("completions", {"prompt": "a", "frequency_penalty": "1"}, 400, "frequency_penalty", "frequency_penalty"),
    ("completions", {"prompt": "a", "repetition_penalty": 0}, 400, "repetition_penalty", "repetition_penalty"),
    ("completions", {"prompt": "a", "logit_bias": [1]}, 400, "logit_bias", "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"a": 1}}, 400, "token ids", "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"-1": 1}}, 400, "token ids", "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"100000": 1}}, 400, "token ids", "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"5": 101}}, 400, "[-100, 100]", "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"5": "1"}}, 400, "[-100, 100]", "logit_bias"),
    ("completions", {"prompt": "a", "tools": TOOLS}, 400, "tools", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}}, 400, "tools", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "code"}]}, 400,
     "function tools", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "a b"}}]}, 400, "letters", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS[:1] * 2}, 400, "twice",
     "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}], "tool_choice": "required"},
     400, "parameters", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400,
     "needs tools", "tool_choice"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "always"},
     400, "tool_choice", "tool_choice"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                          "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "not among",
     "tool_choice"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                          "parallel_tool_calls": "no"}, 400, "parallel_tool_calls", "parallel_tool_calls"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "required",
                          "response_format": {"type": "json_object"}}, 400, "response_format", "tool_choice"),
    ("chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {
        "name": "f"}}]}]}, 400, "arguments", "messages[0].tool_calls"),
    ("chat/completions", {"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, 400, "tool_call_id",
     "messages[0].tool_call_id"),
    ("completions", {"prompt": "a", "response_format": {"type": "xml"}}, 400, "response_format type",
     "response_format"),
    ("completions", {"prompt": "a", "response_format": "json"}, 400, "response_format", "response_format"),
    ("completions", {"prompt": "a", "response_format": {"type": "json_schema"}}, 400, "json_schema",
     "response_format"),
    ("completions", {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nope"}}}}, 400, "schema", "response_format"),
    ("completions", {"prompt": "a", "response_format": {"type": "regex", "regex": "(a"}}, 400, "regex",
     "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "2"}}}},
     400, "schema", "response_format"),
    ("completions", [1, 2], 400, "JSON object", None),
    ("completions", "null", 400, "JSON object", None),
    ("completions", b"{not json", 400, "JSON", None),
    ("completions", b"", 400, "empty", None),
    ("completions", b"\xff\xfe", 400, "JSON", None),
    ("completions", b'{"prompt": "a", "temperature": NaN}', 400, "temperature", "temperature"),
    ("completions", b"[" * 100000 + b"]" * 100000, 400, "JSON", None),
    ("completions", b'{"prompt": "a\\ud800"}', 400, "Unicode", "prompt"),
    ("completions", b'{"prompt": "a", "stop": ["\\udfff"]}', 400, "Unicode", "stop"),
    ("completions", b'{"prompt": "a", "temperature": "\\ud800"}', 400, "temperature", "temperature"),
    ("completions", {"prompt": "a", "model": "gpt-4"}, 404, "gpt-4", "model"),
    ("chat/completions", {}, 400, "messages", "messages"),
    ("chat/completions", {"messages": []}, 400, "messages", "messages"),
    ("chat/completions", {"messages": "hi"}, 400, "messages", "messages"),
    ("chat/completions", {"messages": ["hi"]}, 400, "messages[0]", "messages[0]"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role", "messages[0].role"),
    ("chat/completions", {"messages": [{"content": "hi"}]}, 400, "role", "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user"}]}, 400, "content", "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content",
     "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "text part", "messages[0].content"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "Unicode",
     "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400,
     "temperature", "temperature"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 6}, 400,
     "max_tokens", "max_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "nope"}, 404, "nope",
     "model"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 1}, 400, "boolean",
     "logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
     "needs logprobs", "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs", "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, 400, "echo", "echo"),
    # other servers' output constraints are refused, naming ours, never silently ignored
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "json_schema": {"const": "42"}}, 400,
     '"type": "json_schema"', "json_schema"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "grammar": 'root ::= "a"'}, 400,
     "not GBNF", "grammar"),
    ("completions", {"prompt": "a", "guided_regex": "a+"}, 400, '"type": "regex"', "guided_regex"),
    ("completions", {"prompt": "a", "guided_choice": ["a", "b"]}, 400, "response_format", "guided_choice"),
]


@pytest.mark.parametrize("route,body,status,words,param", BAD,
                         ids=[f"{i}-{b[0]}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input(http, route, body, status, words, param):
    if isinstance(body, (bytes, str)):  # raw body text
        r = http.post(f"/v1/{route}", content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(f"/v1/{route}", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert words in err["message"], err
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


# Extreme values of every sampling field: inside its range a 200 with finite output (the same
# text as greedy decoding where the value leaves one token: tiny temperature, tiny top_p,
# min_p = 1, top_k = 1), outside it a 400 naming the field -- never a 500.
TINY_FLOATS = (5e-324, 1e-46, 1e-39, 1e-300)  # smallest double, under float32's subnormals, ...
ACCEPTED = (
    [({"temperature": t}, True) for t in TINY_FLOATS]
    + [({"temperature": t}, False) for t in (1e-10, 1e10, 1e308, 1.7976931348623157e308)]
    + [({"temperature": 1, "top_p": p}, True) for p in TINY_FLOATS]
    + [({"temperature": 1, "top_p": p}, False) for p in (0.9999999999999999, 1)]
    + [({"temperature": 1, "min_p": m}, m == 1) for m in (5e-324, 1e-300, 0.9999999999999999, 1)]
    + [({"temperature": 1, "top_k": k}, k == 1) for k in (1, 2 ** 63, 10 ** 30)]
    + [({"temperature": 5e-324, "top_p": 5e-324, "min_p": 1, "top_k": 1}, True),
       ({"temperature": 1e308, "top_p": 5e-324, "min_p": 5e-324, "top_k": 10 ** 30}, True),
       ({"temperature": 1e308, "top_p": 1, "min_p": 0, "top_k": 0, "seed": 2 ** 63 - 1, "n": 8}, False),
       ({"temperature": 1e-39, "seed": -(2 ** 63), "n": 8}, True),
       ({"temperature": 1e-39, "max_tokens": 1}, True)]
    + [({"temperature": t, "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": r}, False)
       for t in (0, 1) for r in (5e-324, 1e-300, 1e300, 1.7976931348623157e308)]
    + [({"temperature": 1, "logit_bias": {"3": -100, "4": 100}, "presence_penalty": 2}, False)]
)
REFUSED = [  # (fields, the parameter the 400 must name)
    ({"temperature": -5e-324}, "temperature"), ({"temperature": 1e400}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": -0.0}, "top_p"), ({"top_p": 1.0000000000000002}, "top_p"),
    ({"min_p": -5e-324}, "min_p"), ({"min_p": 1.0000000000000002}, "min_p"),
    ({"top_k": -1}, "top_k"), ({"top_k": 2.0}, "top_k"), ({"top_k": -(10 ** 30)}, "top_k"),
    ({"n": 9}, "n"), ({"seed": 2 ** 63}, "seed"), ({"seed": -(2 ** 63) - 1}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"presence_penalty": 2.0000000000000004}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"repetition_penalty": -5e-324}, "repetition_penalty"), ({"repetition_penalty": 1e400}, "repetition_penalty"),
    ({"logit_bias": {"3": 100.00000000000001}}, "logit_bias"),
    ({"seed_mode": "gumbel"}, "seed_mode"), ({"seed_mode": 1}, "seed_mode"),
]


def _post_raw(http, route: str, body: dict):
    """json.dumps writes 1e400 as Infinity, which the server must refuse like any JSON it reads."""
    return http.post(f"/v1/{route}", content=json.dumps(body), headers={"Content-Type": "application/json"})


def _request(route: str, fields: dict) -> dict:
    base = ({"prompt": PROMPT} if route == "completions" else
            {"messages": [{"role": "user", "content": PROMPT}]})
    return {**base, "max_tokens": 4, **fields}


@pytest.fixture(scope="module")
def greedy_texts(reference):
    return {"completions": greedy(reference, PROMPT, 4).text,
            "chat/completions": greedy(reference, chat_prompt([{"role": "user", "content": PROMPT}]), 4).text}


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
@pytest.mark.parametrize("fields,one_token", ACCEPTED, ids=[str(f) for f, _ in ACCEPTED])
def test_extreme_sampling_values_are_served(http, route, fields, one_token, greedy_texts):
    body = _request(route, fields)
    r = _post_raw(http, route, body)
    assert r.status_code == 200, r.text
    resp = r.json()
    n = fields.get("n", 1)
    texts = [c["text"] if route == "completions" else c["message"]["content"] for c in resp["choices"]]
    assert len(texts) == n and all(c["finish_reason"] in ("stop", "length") for c in resp["choices"])
    assert 1 <= resp["usage"]["completion_tokens"] <= n * body["max_tokens"]
    want = greedy_texts[route] if body["max_tokens"] == 4 else None
    if one_token and want is not None:
        assert texts == [want] * n
    # streamed too: no error event inside the 200 stream
    with http.stream("POST", f"/v1/{route}", content=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"}) as s:
        assert s.status_code == 200
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert not any("error" in c for c in chunks), chunks
    if one_token and want is not None and n == 1:
        key = "text" if route == "completions" else "delta"
        streamed = "".join(c["choices"][0][key] if key == "text" else c["choices"][0][key].get("content", "")
                           for c in chunks if c["choices"])
        assert streamed == want


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
@pytest.mark.parametrize("fields,param", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_out_of_range_sampling_values_are_refused(http, route, fields, param):
    r = _post_raw(http, route, _request(route, fields))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]
    if param in SAMPLING_BOUNDS:  # the server says what the library accepts
        assert SAMPLING_BOUNDS[param].requirement in err["message"]


def test_context_error_names_both_numbers(http, reference):
    prompt_tokens = len(reference.tokenizer.encode(BIG))
    r = http.post("/v1/completions", json={"prompt": BIG, "max_tokens": 190})
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and str(prompt_tokens) in msg and "190" in msg and "256" in msg


def test_openai_client_sees_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=-1)
    assert "temperature" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt=PROMPT, max_tokens=N)


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/nope"),
                                         ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"},
                                     {"Authorization": f"Bearer {API_KEY}x"}])
def test_auth(server, method, path, headers):
    r = httpx.request(method, f"{server.url}{path}", headers=headers, json={"prompt": "a"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_routes_and_methods(http, server):
    r = http.get("/nope")
    assert r.status_code == 404 and "/nope" in r.json()["error"]["message"]
    r = http.get("/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = http.get("/v1/completions")
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_routes_leave_validation_to_the_parser():
    """FastAPI validates nothing (so the app needs no RequestValidationError handler): no route
    declares a body, query, header, cookie or dependency, and the only path parameter is a str."""
    from specdec.server.routes import router

    routes = router.routes
    assert {r.path for r in routes} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}
    for route in routes:
        d = route.dependant
        assert route.body_field is None and not (d.body_params or d.query_params or d.header_params
                                                 or d.cookie_params or d.dependencies), route.path
        assert all(p.field_info.annotation is str for p in d.path_params), route.path


def test_body_too_large(http):
    big = json.dumps({"prompt": "a", "user": "x" * (1 << 20)}).encode()
    r = http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the size is checked while reading
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    r = http.post("/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- concurrency

def test_concurrent_greedy_clients(server, reference):
    prompts = [PROMPT, "class Point:", "for i in range(10):", "print(", "héllo wörld", "x = 1"] * 3
    prompts = prompts[:16]
    want = [greedy(reference, p).text for p in prompts]

    def one(i):
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            body = {"model": MODEL, "prompt": prompts[i], "max_tokens": N, "temperature": 0}
            if i % 2:
                lines = []
                with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                assert lines[-1] == "data: [DONE]"
                return "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in lines[:-1])
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(16)))
    assert got == want
    server.wait_idle()


def test_cancelled_streams_free_the_engine(server, reference):
    before = server.wait_idle()
    max_tokens = 200  # uncancelled, 50 of these would keep the engine busy for a long while
    # greedy: this prompt runs to max_tokens (no EOS)
    body = {"model": MODEL, "prompt": "x = 1", "max_tokens": max_tokens, "temperature": 0, "stream": True}

    def drop(_):
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                next(r.iter_raw())  # the first chunk, then hang up

    with ThreadPoolExecutor(5) as pool:
        list(pool.map(drop, range(50)))
    t0 = time.monotonic()
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=5) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": N,
                                            "temperature": 0})
    assert r.status_code == 200 and time.monotonic() - t0 < 5
    assert r.json()["choices"][0]["text"] == greedy(reference, PROMPT).text
    after = server.wait_idle(5)
    assert after["specdec:num_requests_running"] == 0
    cancelled = after["specdec:requests_cancelled_total"] - before["specdec:requests_cancelled_total"]
    assert cancelled >= 40
    generated = after["specdec:generation_tokens_total"] - before["specdec:generation_tokens_total"]
    assert generated < 50 * max_tokens / 2


class GatedDecoder:
    """Wraps a decoder; each step of its loop waits for the gate to open."""

    def __init__(self, decoder):
        self._decoder = decoder
        self.gate = threading.Event()

    def __getattr__(self, name):
        return getattr(self._decoder, name)

    def scheduler(self, max_batch=8):
        return GatedBatch(self._decoder.scheduler(max_batch), self.gate)


class GatedBatch:
    def __init__(self, batch, gate):
        self._batch, self._gate = batch, gate

    def __getattr__(self, name):
        return getattr(self._batch, name)

    def __len__(self):
        return len(self._batch)

    def step(self):
        assert self._gate.wait(30)
        return self._batch.step()


@pytest.fixture(scope="module")
def gated(model_dir):
    """A plain (method none) server with a one-place queue whose engine waits for a gate."""
    decoder = GatedDecoder(specdec.load(model_dir))
    live = LiveServer(create_app(decoder, ServerSettings(max_queue=1)))
    yield decoder, live
    decoder.gate.set()
    live.stop()


def _wait_for(live, name, value, timeout=10):
    deadline = time.monotonic() + timeout
    while live.metrics()[name] != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def test_queue_full_gives_429(gated):
    decoder, live = gated
    decoder.gate.clear()
    url = f"{live.url}/v1/completions"
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, url, json=body, timeout=30)
            _wait_for(live, "specdec:num_requests_running", 1)
            second = pool.submit(httpx.post, url, json=body, timeout=30)
            _wait_for(live, "specdec:num_requests_waiting", 1)
            r = httpx.post(url, json=body, timeout=30)
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "queue_full" and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            decoder.gate.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
    finally:
        decoder.gate.set()
    assert live.wait_idle()["specdec:num_requests_running"] == 0
    m = live.metrics()
    assert m['specdec:http_requests_total{endpoint="/v1/completions",method="POST",status="429"}'] == 1
    # a plain server reports no speculative stats
    r = httpx.post(url, json=body, timeout=30).json()
    assert r["speculative"] == {"method": "none", "drafted_tokens": 0, "accepted_tokens": 0,
                                "num_drafts": 0, "mean_accepted_length": None, "acceptance_rate": None,
                                "lossy": False}


def test_cancelled_requests_are_skipped(gated):
    """A non-streamed request whose client gives up, and a stream dropped while still queued."""
    decoder, live = gated
    decoder.gate.clear()
    before = live.wait_idle()
    body = {"prompt": "x = 1", "max_tokens": 200, "temperature": 0}
    try:
        with pytest.raises(httpx.ReadTimeout):  # runs (blocked at the gate); the client gives up
            httpx.post(f"{live.url}/v1/completions", json={**body, "n": 8}, timeout=0.5)
        with httpx.Client(base_url=live.url, timeout=30) as c:  # queued behind it, then dropped
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200
            time.sleep(0.2)  # let the server see both disconnects
    finally:
        decoder.gate.set()
    after = live.wait_idle()
    assert after["specdec:requests_cancelled_total"] - before["specdec:requests_cancelled_total"] == 2
    # the running one stopped after a step; the queued one never reached the engine
    assert after["specdec:generation_tokens_total"] - before["specdec:generation_tokens_total"] < 200
    assert after["specdec:prompt_tokens_total"] - before["specdec:prompt_tokens_total"] == 4


# ---------------------------------------------------------------- metrics

SPEC = ("specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_draft_tokens_total",
        "specdec:spec_decode_num_accepted_tokens_total")


def test_metrics_match_responses(server, http):
    text = http.get("/metrics").text
    for name in SPEC + ("specdec:num_requests_running", "specdec:generation_tokens_total",
                        "specdec:http_request_duration_seconds_count", "specdec:http_requests_total"):
        assert re.search(rf"^{re.escape(name)}[ {{]", text, re.M), name
    assert re.search(r'^specdec:spec_decode_num_accepted_tokens_per_pos_total\{position="0"\} ', text, re.M)
    before = server.wait_idle()

    spec = []
    for body in ({"prompt": PROMPT, "max_tokens": N, "temperature": 0},
                 {"prompt": "class Point:", "max_tokens": 16, "temperature": 1.0, "n": 3, "seed": 1}):
        spec.append(http.post("/v1/completions", json=body).json()["speculative"])
    with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": N, "temperature": 0.5, "seed": 2,
            "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    spec.append(chunks[-1]["speculative"])
    after = server.wait_idle()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta("specdec:spec_decode_num_drafts_total") == sum(s["num_drafts"] for s in spec)
    assert delta("specdec:spec_decode_num_draft_tokens_total") == sum(s["drafted_tokens"] for s in spec)
    assert delta("specdec:spec_decode_num_accepted_tokens_total") == sum(s["accepted_tokens"] for s in spec)
    per_pos = {int(m.group(1)): delta(m.group(0)) for name in after
               if (m := re.fullmatch(r'specdec:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}',
                                     name))}
    assert sum(per_pos.values()) == delta("specdec:spec_decode_num_accepted_tokens_total") > 0
    assert max(p for p, v in per_pos.items() if v) < K
    assert all(per_pos[p] >= per_pos.get(p + 1, 0) for p in per_pos)  # position i+1 needs position i
    assert delta('specdec:http_requests_total{endpoint="/v1/completions",method="POST",status="200"}') == 2


def test_accepted_per_position():
    assert accepted_per_position([3, 1, 0, 2]) == [3, 2, 2]  # steps keeping 1, 3, 3 drafts
    assert accepted_per_position([5]) == []


# ---------------------------------------------------------------- CLI

def test_serve_cli_arguments(capsys):
    from specdec.cli.main import build_parser, main

    args = build_parser().parse_args(["serve", "--target", "t", "--method", "draft", "--draft-tokens", "3",
                                      "--port", "9000", "--api-key", "k", "--max-queue", "5",
                                      "--max-tokens-limit", "100", "--model-name", "m"])
    assert (args.target, args.method, args.draft_tokens, args.port, args.api_key, args.max_queue,
            args.max_tokens_limit, args.model_name, args.host) == ("t", "draft", 3, 9000, "k", 5, 100, "m",
                                                                   "127.0.0.1")
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "--max-queue" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 2
