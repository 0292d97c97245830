"""Tool calling: the prompt (tool prompt in the system message, earlier calls and results as
text), parsing replies into OpenAI tool_calls, and the grammar that enforces tool_choice
"required" / a named function / parallel_tool_calls=false (tiny model, so every reply is the
grammar's doing); the calls read as the text grows (tool_stream.CallStream) against the
whole reply parsed, and the chunks a streamed choice makes of them; the server's side is in
test_server.py."""
import json
from types import SimpleNamespace

import pytest

import specdec
from specdec.chat.tool_stream import CallStream
from specdec.chat.tools import CLOSE, OPEN, Tool, ToolSettings, call_grammar, parse_calls, render_messages

from helpers import make_model_dir

WEATHER = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {
    "city": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False})
TIME = Tool("get_time", "Time in a zone", {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                           "required": ["zone"], "additionalProperties": False})
TOOLS = (WEATHER, TIME)


def test_parse_calls():
    settings = ToolSettings(TOOLS)
    text = f'Let me look. {OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}, ' \
           f'{{"name": "get_weather", "arguments": {{"city": "oslo", "unit": "c"}}}}]{CLOSE}'
    content, calls = parse_calls(text, settings)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert calls[1]["function"]["arguments"] == '{"city": "oslo", "unit": "c"}'  # the model's own JSON text
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert [c["id"] for c in parse_calls(text, settings, "response-1")[1]] == \
        [c["id"] for c in parse_calls(text, settings, "response-1")[1]] != \
        [c["id"] for c in parse_calls(text, settings, "response-2")[1]]  # deterministic per response
    assert len(parse_calls(text, ToolSettings(TOOLS, parallel=False))[1]) == 1
    for bad in ("no call here", f"{OPEN}[{{\"name\": \"nope\", \"arguments\": {{}}}}]{CLOSE}", f"{OPEN}[{{oops"):
        assert parse_calls(bad, settings) == (bad, None)
    assert parse_calls(text, ToolSettings(TOOLS, "none")) == (text, None)
    single = f'{OPEN}{{"name": "get_time", "arguments": {{"zone": "cet"}}}}{CLOSE}'  # one object, no list
    assert parse_calls(single, settings)[0] is None and len(parse_calls(single, settings)[1]) == 1


def test_render_messages():
    settings = ToolSettings(TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}
    messages = [{"role": "user", "content": "time?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "12:00", "tool_call_id": "c1"}]
    out = render_messages(messages, settings, template_takes_tools=False)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"] and "<tools>" in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": f'{OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}]'
                                                       f"{CLOSE}"}
    assert out[3] == {"role": "tool", "content": "12:00"}
    merged = render_messages([{"role": "system", "content": "Be brief."}] + messages, settings, False)
    assert merged[0]["content"].endswith("\n\nBe brief.") and len(merged) == 4
    assert render_messages(messages, settings, template_takes_tools=True) is messages
    assert render_messages(messages, ToolSettings(TOOLS, "none"), False)[0]["role"] == "user"  # no tool prompt


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("t"), layers=2, kv_heads=1, max_pos=256)
    return (specdec.load(target=target, dtype="float64"),
            specdec.load(target=target, draft=target, method="draft", dtype="float64", draft_tokens=4))


@pytest.mark.parametrize("choice,parallel", [("required", True), ("get_weather", True), ("required", False)])
def test_the_grammar_makes_the_call(decoders, choice, parallel):
    """A random tiny model answers with a well-formed call to the allowed function(s), whose
    arguments fit the parameters' schema; speculative == plain (greedy)."""
    pytest.importorskip("llguidance")
    plain, spec = decoders
    settings = ToolSettings(TOOLS, choice, parallel)
    grammar = call_grammar(settings)
    for prompt in ["weather?", "def f(x):"]:
        want = plain.generate(prompt, max_new_tokens=200, grammar=grammar)
        assert spec.generate(prompt, max_new_tokens=200, grammar=grammar).token_ids == want.token_ids
        assert want.finish_reason == "stop", want.text
        content, calls = parse_calls(want.text, settings)
        assert content is None and calls, want.text
        assert all(c["function"]["name"] in ({choice} if choice != "required" else {"get_weather", "get_time"})
                   for c in calls)
        for c in calls:
            args = json.loads(c["function"]["arguments"])
            assert set(args) == ({"city", "unit"} if c["function"]["name"] == "get_weather" else {"zone"})
        if not parallel:
            assert want.text.count('"name"') == 1


def test_auto_and_none_need_no_grammar():
    assert call_grammar(ToolSettings(TOOLS, "auto")) is None and call_grammar(ToolSettings(TOOLS, "none")) is None


CALLED = [  # replies that call tools: content or not, several calls, key order, spacing, odd strings
    f'{OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}]{CLOSE}',
    f'Let me look.  \n{OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}, '
    f'{{"name": "get_weather", "arguments": {{"city": "oslo", "unit": "c"}}}}]{CLOSE}',
    f' <b>x</b> <tool {OPEN} [ {{ "arguments" :{{"city":"b\\"}}</tool_call>\u00e9", "unit": [1, {{}}]}} ,'
    f'"name":"get_weather", "extra": 1.5e3}} , {{"name": "get_time"}} ]\n</tool_call>ignored',
    f'{OPEN}{{"name": "get_time", "arguments": {{"zone": "cet"}}}}',  # one object, no list, no closing tag
]
NOT_CALLED = [  # replies parse_calls leaves as text, and whether a call's first delta went out before
    ("no call here, <tool but no call <", False),  # it turned out wrong (fed character by character)
    (f'{OPEN}[{{"name": "nope", "arguments": {{}}}}]{CLOSE}', False),
    (f'{OPEN}[{{"arguments": {{"zone": "utc"}}}}]{CLOSE}', False),
    (f'{OPEN}[]{CLOSE}', False),
    (f'{OPEN}"get_time"{CLOSE}', False),
    (f'{OPEN}[{{"name": "get_time", "arguments": "utc"}}]{CLOSE}', True),
    (f'{OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}', True),  # cut short
    (f'{OPEN}[{{"name": "get_time", "arguments": {{"zone": "utc"}}}}] trailing{CLOSE}', True),
    (f'{OPEN}[{{"name": "get_time", "arguments": {{"zone": utc}}}}]{CLOSE}', True),
]


def read(text: str, cuts, settings: ToolSettings | None = None) -> tuple[list[tuple], CallStream]:
    """CallStream's events for text fed in pieces ending at cuts."""
    reader, events, last = CallStream(settings or ToolSettings(TOOLS), "s"), [], 0
    for cut in [*cuts, len(text)]:
        events += reader.feed(text[last:cut])
        last = cut
    return events + reader.finish(), reader


def joined(events, kind: str, index: int | None = None) -> str:
    return "".join(e[-1] for e in events if e[0] == kind and (index is None or e[1] == index))


@pytest.mark.parametrize("text", CALLED)
def test_calls_streamed_as_written_equal_the_parsed_calls(text):
    """Fed in any pieces (every split in two, and character by character), the reader sends
    the parsed content (nothing of the markup), each call's id and name once (indices 0, 1, ...),
    and argument fragments that join into the parsed arguments."""
    content, calls = parse_calls(text, ToolSettings(TOOLS), "s")
    assert calls
    for cuts in [[i] for i in range(len(text) + 1)] + [range(len(text))]:
        events, reader = read(text, cuts)
        assert reader.ok
        assert joined(events, "content") == (content or "")
        assert [e[1:] for e in events if e[0] == "call"] == [(j, c["id"], c["function"]["name"])
                                                             for j, c in enumerate(calls)]
        for j, c in enumerate(calls):
            assert joined(events, "arguments", j) == c["function"]["arguments"]
            first = events.index(("call", j, c["id"], c["function"]["name"]))
            assert all(events.index(e) > first for e in events if e[0] == "arguments" and e[1] == j)
    one, _ = read(text, range(len(text)), ToolSettings(TOOLS, parallel=False))
    assert {e[1] for e in one if e[0] != "content"} == {0}


def test_nothing_is_sent_that_a_later_character_could_change():
    """Content stops short of what may still become <tool_call> or whitespace before it; a
    name is sent only once its string closed, never a partial one."""
    text = CALLED[1]
    at = text.index(OPEN)
    for end in range(len(text) + 1):
        reader = CallStream(ToolSettings(TOOLS), "s")
        events = reader.feed(text[:end])
        assert joined(events, "content") == text[:min(end, at)].rstrip()
        names = [e[3] for e in events if e[0] == "call"]
        assert names == [n for n in ("get_time", "get_weather") if f'"{n}"' in text[at:end]]


@pytest.mark.parametrize("text,late", NOT_CALLED)
def test_replies_without_a_proper_call(text, late):
    """parse_calls gives the text back; the stream says no call. Found wrong before a call's
    first delta, its content is the whole text too; after, nothing more is sent."""
    assert parse_calls(text, ToolSettings(TOOLS)) == (text, None)
    for cuts in ([], range(len(text))):  # whole, and character by character
        events, reader = read(text, cuts)
        assert not reader.ok
        if any(e[0] == "call" for e in events):
            assert late and joined(events, "content") == ""
        else:
            assert joined(events, "content") == text and all(e[0] == "content" for e in events)
    assert late == any(e[0] == "call" for e in events)


def test_a_streamed_choice_sends_openai_tool_call_chunks():
    """The chunks of a streamed chat choice: content before the call, then per call a first
    delta {index, id, type, function: {name, arguments: ""}} and fragments {index, function:
    {arguments}}, finish_reason tool_calls; they add up to the non-streamed message."""
    pytest.importorskip("fastapi")
    from specdec.server.responses import ChoiceStream, ResponseHeader, chat_message

    head = ResponseHeader("chatcmpl-1", 0, "m", True, "none")
    req = SimpleNamespace(tools=ToolSettings(TOOLS), logprobs=None, echo=False)
    text = CALLED[1]
    result = SimpleNamespace(text=text, finish_reason="stop", token_ids=[])
    message, finish = chat_message(head, req, result, 0)
    stream = ChoiceStream(head, req, 0)
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    chunks = stream.opening(None, None) + [c for p in pieces[:-1] for c in stream.step(p, None)]
    chunks += stream.finish(pieces[-1], result)
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + [finish] == \
        [None] * (len(choices) - 1) + ["tool_calls"]
    deltas = [c["delta"] for c in choices[1:-1]]
    assert "".join(d.get("content", "") for d in deltas) == message["content"] == "Let me look."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    firsts = [c for c in calls if "id" in c]
    assert firsts == [{"index": j, "id": want["id"], "type": "function",
                       "function": {"name": want["function"]["name"], "arguments": ""}}
                      for j, want in enumerate(message["tool_calls"])]
    for j, want in enumerate(message["tool_calls"]):
        fragments = [c for c in calls if c["index"] == j and "id" not in c]
        assert len(fragments) > 1 and all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
                                          for c in fragments)
        assert "".join(c["function"]["arguments"] for c in fragments) == want["function"]["arguments"]
