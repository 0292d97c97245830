"""The request's `messages` array, checked (parse_messages). Rendering it into one prompt is
specdec.chat_template's job (shared with `specdec chat`)."""
from __future__ import annotations

from specdec.server.errors import bad_request
from specdec.server.fields import check_text, describe, short

CHAT_ROLES = ("system", "developer", "user", "assistant")


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
    return out
