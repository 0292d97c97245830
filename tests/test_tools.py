"""Tool calling: the prompt (tool prompt in the system message, earlier calls and results as
text), parsing replies into OpenAI tool_calls, and the grammar that enforces tool_choice
"required" / a named function / parallel_tool_calls=false (tiny model, so every reply is the
grammar's doing); the server's side is in test_server.py."""
import json

import pytest

import specdec
from specdec.tools import CLOSE, OPEN, Tool, ToolSettings, call_grammar, parse_calls, render_messages

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
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "oslo", "unit": "c"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
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
