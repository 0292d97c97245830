"""Tool calling in chat: the tools go into the prompt, the model answers with a call in a
fixed text format, and the call is parsed back into OpenAI's shape.

The format is SmolLM2's (its instruct models were tuned on it): the system prompt lists the
tools as JSON inside <tools></tools> and the model writes
<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>. A chat template that takes
`tools` itself (its source mentions them) renders them its own way; otherwise (SmolLM2-135M's
plain ChatML template) the tool prompt is written here into the system message, and earlier
assistant calls and tool results are rendered as text the template can show.

tool_choice "required" or a named function is enforced by a grammar (grammar.py: the call
must parse, name a given function and match its parameters' JSON schema), so speculation
keeps the constrained distribution; "auto" leaves the model free and parses what it wrote.
parallel_tool_calls=false allows one call: enforced by the grammar when constrained, and for
"auto" only the first call is returned. Streaming the calls as they are written is
tool_stream.py's."""
from __future__ import annotations

import json
from dataclasses import dataclass

from specdec.chat.tool_stream import CLOSE, OPEN, CallStream
from specdec.sampling.grammar import Grammar

SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "If none of the functions can be used, answer the question directly in plain text.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "To call tools, reply with nothing but a JSON list of calls inside tags, in this format:\n"
    '<tool_call>[{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}}]'
    "</tool_call>"
)
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolSettings:
    tools: tuple[Tool, ...]
    choice: str = "auto"  # "auto" | "required" | "none" | the name of the one function to call
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the tools are offered at all (tool_choice "none": plain chat)."""
        return bool(self.tools) and self.choice != "none"


def render_messages(messages: list[dict], settings: ToolSettings, template_takes_tools: bool) -> list[dict]:
    """Messages ready for a template that does not take tools: the tool prompt in the system
    message, assistant calls and tool results as text."""
    if template_takes_tools:
        return messages
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if calls:
            shown = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                     for c in calls]
            m["content"] = (m.get("content") or "") + OPEN + json.dumps(shown) + CLOSE
        m.pop("tool_call_id", None)
        out.append(m)
    if settings.active:
        prompt = SYSTEM_PROMPT.format(tools=json.dumps([t.openai()["function"] for t in settings.tools]))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": prompt + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def call_grammar(settings: ToolSettings) -> Grammar | None:
    """The grammar of a reply that must call tools ("required", or a named function)."""
    if settings.choice in ("auto", "none"):
        return None
    tools = [t for t in settings.tools if settings.choice in ("required", t.name)]
    calls = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                        "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
    schema = {"type": "array", "items": calls, "minItems": 1, "x-guidance": COMPACT}
    if not settings.parallel:
        schema["maxItems"] = 1
    return Grammar("lark", f'start: "{OPEN}" calls "{CLOSE}"\ncalls: %json {json.dumps(schema)}')


def parse_calls(text: str, settings: ToolSettings, seed: str = "") -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls in OpenAI's shape) of a reply; (text, None) when it calls nothing
    parseable. Text before the call is the content (None when there is none); each call's
    arguments are the model's JSON text of them, its id derived from seed and its index.
    The reader is tool_stream's, so a streamed reply sends exactly these calls."""
    if not settings.active or OPEN not in text:
        return text, None
    reader = CallStream(settings, seed)
    reader.feed(text)
    reader.finish()
    if not reader.ok:
        return text, None
    return reader.content(), reader.openai_calls()
