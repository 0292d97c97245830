"""The request's `messages` array, checked (parse_messages), and its tools (parse_tools).
Rendering it into one prompt is specdec.chat.template's job (shared with `specdec chat`);
the tool-call format is specdec.chat.tools'."""
from __future__ import annotations

import re

from specdec.chat.tools import Tool, ToolSettings
from specdec.server.errors import bad_request
from specdec.server.fields import check_text, describe, short

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


def parse_messages(body: dict) -> list[dict]:
    """body["messages"] as [{"role", "content"[, "name"]}], text parts joined into one string."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("missing required parameter 'messages'", "messages")
    if not isinstance(messages, list):
        raise bad_request(f"messages must be an array of message objects, got {describe(messages)}",
                          "messages")
    if not messages:
        raise bad_request("messages must hold at least one message", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(m, where: str) -> dict:
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object with 'role' and 'content', got {describe(m)}", where)
    role = m.get("role")
    if role not in CHAT_ROLES:
        roles = ", ".join(repr(r) for r in CHAT_ROLES)
        shown = ("missing" if role is None else repr(short(role)) if isinstance(role, str)
                 else describe(role))
        raise bad_request(f"{where}.role must be one of {roles}, got {shown}", f"{where}.role")
    content = m.get("content")
    calls = m.get("tool_calls") if role == "assistant" else None
    if content is None and calls:  # an assistant turn that only called tools
        content = ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"{where}.content[{j}] must be a text part "
                                  "{\"type\": \"text\", \"text\": \"...\"} (other content types "
                                  "are not supported)", f"{where}.content")
            parts.append(part["text"])
        content = "".join(parts)
    elif not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or an array of text parts, got "
                          f"{'missing' if 'content' not in m else describe(content)}", f"{where}.content")
    out = {"role": role, "content": check_text(content, f"{where}.content")}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"{where}.name must be a string, got {describe(name)}", f"{where}.name")
        out["name"] = check_text(name, f"{where}.name")
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
    if role == "tool":
        call_id = m.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"{where}.tool_call_id must be a string, got {describe(call_id)}",
                              f"{where}.tool_call_id")
        if call_id is not None:
            out["tool_call_id"] = call_id
    return out


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's earlier calls: [{id, type: function, function: {name, arguments}}]."""
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be an array of tool calls, got {describe(calls)}", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)):
            raise bad_request(f"{where}[{j}] must be {{\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"arguments\": \"<JSON text>\"}}", where)
        function = {"name": check_text(fn["name"], where), "arguments": check_text(fn["arguments"], where)}
        out.append({"id": str(call.get("id", "")), "type": "function", "function": function})
    return out


def parse_tools(body: dict) -> ToolSettings | None:
    """tools, tool_choice and parallel_tool_calls; None when no tools are given."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request(f"parallel_tool_calls must be true or false, got {describe(parallel)}",
                          "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"tools must be an array of at most {MAX_TOOLS} function tools, got {describe(tools)}",
                          "tools")
    parsed = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    if len({t.name for t in parsed}) < len(parsed):
        raise bad_request("tools name a function twice", "tools")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                              '"function": {"name": ...}}', "tool_choice")
        if name not in {t.name for t in parsed}:
            raise bad_request(f"tool_choice names {short(name)!r}, which is not among the tools", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                          f'"function": {{"name": ...}}}}, got {describe(choice)}', "tool_choice")
    return ToolSettings(parsed, choice, parallel)


def _tool(t, where: str) -> Tool:
    fn = t.get("function") if isinstance(t, dict) else None
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
        raise bad_request(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} "
                          "(only function tools are supported)", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, _ or -, got {describe(name)}",
                          "tools")
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise bad_request(f"{where}.function.description must be a string", "tools")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object, got {describe(parameters)}",
                          "tools")
    return Tool(name, check_text(description, "tools"), parameters)
