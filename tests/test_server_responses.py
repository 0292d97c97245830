"""POST /v1/responses (the Responses API on the chat path): the openai client's calls get the
library's greedy output for the same chat, streamed as the documented events, and what the
API cannot do here is a 400 naming the parameter (what scripts/client_suite.py found missing)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

import test_server  # noqa: E402
from test_server import API_KEY, LiveServer, chat_prompt, one_torch_thread  # noqa: E402, F401

import specdec  # noqa: E402
from specdec.server.app import ServerSettings, create_app  # noqa: E402

from helpers import make_model_dir  # noqa: E402

MODEL = "tiny"
N = 12
INSTRUCTIONS = "be brief"
MESSAGES = [{"role": "user", "content": "def add"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("server-responses") / "tiny")


@pytest.fixture(scope="module")
def reference(model_dir):
    return specdec.load(model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    decoder = specdec.load(model_dir, model_dir, method="draft", draft_tokens=4)
    live = LiveServer(create_app(decoder, ServerSettings(model_name=MODEL, api_key=API_KEY)))
    yield live
    live.stop()


client, http = test_server.client, test_server.http  # its fixtures, on this module's server


def greedy_chat(reference, max_tokens=N, **kw):
    prompt = chat_prompt([{"role": "system", "content": INSTRUCTIONS}, *MESSAGES])
    return reference.generate(prompt, temperature=0, max_new_tokens=max_tokens, **kw), prompt


def test_response_is_the_chat_answer(client, reference):
    want, prompt = greedy_chat(reference)
    res = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=MESSAGES, max_output_tokens=N,
                                  temperature=0, metadata={"run": "1"})
    assert res.id.startswith("resp_") and res.object == "response" and res.model == MODEL
    assert res.output[0].type == "message" and res.output[0].id.startswith("msg_")
    assert res.output_text == want.text
    assert res.usage.input_tokens == len(reference.tokenizer.encode(prompt))
    assert res.usage.output_tokens == len(want.token_ids) <= N
    assert res.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert (res.incomplete_details is not None) == (res.status == "incomplete")
    assert res.metadata == {"run": "1"} and res.instructions == INSTRUCTIONS
    same = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="def add", max_output_tokens=N,
                                   temperature=0)  # a string input is one user message
    assert same.output_text == want.text


def test_stream_events(client, http, reference):
    want, _ = greedy_chat(reference)
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": MESSAGES, "max_output_tokens": N,
            "temperature": 0, "stream": True}
    events = []
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    kinds = [e["type"] for e in events]
    final = "response.incomplete" if want.finish_reason == "length" else "response.completed"
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          final]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    item = events[2]["item"]["id"]
    assert all(e["item_id"] == item for e in events[3:-2]) and events[-2]["item"]["id"] == item
    assert "".join(e["delta"] for e in events[4:-4]) == events[-4]["text"] == want.text
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == want.text
    # the openai client reads the same stream
    text = "".join(e.delta for e in client.responses.create(**body) if e.type == "response.output_text.delta")
    assert text == want.text


def test_text_format(client, reference):
    pytest.importorskip("llguidance")
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    want, _ = greedy_chat(reference, 20, response_format=fmt)
    text = {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}
    res = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=MESSAGES, max_output_tokens=20,
                                  temperature=0, text=text)
    assert res.output_text == want.text and set(json.loads(res.output_text)) == {"ok"}


BAD = [  # (body fields, words in the message, param)
    ({"input": []}, "input", "input"),
    ({"input": 5}, "input", "input"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "function_call_output",
     "input[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "role", "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text part",
     "input[0].content"),
    ({"input": "hi", "instructions": 3}, "instructions", "instructions"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "schema", "text.format"),
    ({"input": "hi", "text": {"format": {"type": "sound"}}}, "type", "text.format"),
    ({"input": "hi", "text": "json"}, "format", "text"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools", "tools"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "previous_response_id"),
    ({"input": "hi", "background": True}, "background", "background"),
    ({"input": "hi", "model": "other"}, "does not exist", "model"),
]


@pytest.mark.parametrize("fields,words,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests(http, fields, words, param):
    r = http.post("/v1/responses", json=fields)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"] == param, err

