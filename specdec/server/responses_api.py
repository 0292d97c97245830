"""A minimal OpenAI Responses API (POST /v1/responses) on the chat path: the request becomes a
chat request (chat_body), is checked and generated exactly as /v1/chat/completions is, and
the result is written as a Response object or as the documented stream of events.

Taken: `input` (a string, or message items {"role", "content": a string or input_text /
output_text parts}), `instructions` (a system message before the input), `max_output_tokens`,
`temperature`, `top_p`, `text.format` (text, json_object, json_schema with its schema: the
chat path's grammar), `stream`, `model`, `user`; `metadata` is echoed back. Refused with a
400 rather than ignored: tools, previous_response_id / conversation (nothing is stored),
background, reasoning, other item and part types (images, files, function calls).

Stream (each event has `type` and `sequence_number`): response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta ...,
response.output_text.done, response.content_part.done, response.output_item.done, then
response.completed, or response.incomplete when max_output_tokens ended it; an error while
generating is an `error` event. No [DONE] line (OpenAI sends none here)."""
from __future__ import annotations

import json
import time
import uuid

from specdec.engine.sequence import GenerationResult
from specdec.server import responses
from specdec.server.errors import ApiError, bad_request
from specdec.server.fields import describe
from specdec.server.request import GenerationRequest

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
PASSED = ("model", "temperature", "top_p", "user", "stream")  # same name, same meaning in chat
REFUSED = {  # name -> the values that mean "off" (accepted)
    "tools": ([],), "tool_choice": ("none", "auto"), "previous_response_id": (), "conversation": (),
    "background": (False,), "reasoning": (), "prompt": (),
}
RENAMED = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format"}


def chat_body(body: dict) -> dict:
    """The chat-completions request that answers this Responses request."""
    for name, off in REFUSED.items():
        value = body.get(name)
        if value is not None and value not in off:
            raise bad_request(f"{name} is not supported by this server's Responses API (got {describe(value)})", name)
    chat = {key: body[key] for key in PASSED if key in body}
    chat["messages"] = _instructions(body.get("instructions")) + _input(body.get("input"))
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def renamed(error: ApiError) -> ApiError:
    """A chat-path error, in the names the Responses request used."""
    for chat_name, name in RENAMED.items():
        error.message = error.message.replace(chat_name, name)
        if error.param == chat_name:
            error.param = name
    return error


def _instructions(value) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise bad_request(f"instructions must be a string, got {describe(value)}", "instructions")
    return [{"role": "system", "content": value}]


def _input(value) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request(f"input must be a string or a non-empty array of messages, got {describe(value)}", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _item(item, where: str) -> dict:
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        kind = item.get("type") if isinstance(item, dict) else None
        raise bad_request(f"{where} must be a message {{\"role\": ..., \"content\": ...}}"
                          + (f" (items of type {kind!r} are not supported)" if kind else ""), where)
    if item.get("role") not in ROLES:
        raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got {describe(item.get('role'))}",
                          f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
                raise bad_request(f"{where}.content[{j}] must be a text part {{\"type\": \"input_text\", "
                                  "\"text\": ...}} (other content types are not supported)", f"{where}.content")
        content = [{"type": "text", "text": part["text"]} for part in content]
    elif not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or an array of text parts, got {describe(content)}",
                          f"{where}.content")
    return {"role": item["role"], "content": content}


def _format(text) -> dict | None:
    """text.format as chat's response_format; the Responses API requires json_schema's schema."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        raise bad_request('text must be {"format": {"type": "text" | "json_object" | "json_schema", ...}}', "text")
    if fmt.get("type") != "json_schema":
        return fmt
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request('text.format json_schema needs "schema": a JSON schema object', "text.format")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}


class ResponseWriter:
    """The objects of one response: the Response itself, its message item and its events."""

    def __init__(self, body: dict, req: GenerationRequest, model: str, method: str):
        self.body, self.req, self.model, self.method = body, req, model, method
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.sequence = 0

    def part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def message(self, text: str | None) -> dict:
        """The output message item; None: still being written."""
        return {"type": "message", "id": self.message_id, "role": "assistant",
                "status": "in_progress" if text is None else "completed",
                "content": [] if text is None else [self.part(text)]}

    def response(self, result: GenerationResult | None) -> dict:
        """The Response object: in progress (None) or finished with this result."""
        text = self.body.get("text")
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": "in_progress",
               "error": None, "incomplete_details": None, "instructions": self.body.get("instructions"),
               "max_output_tokens": self.body.get("max_output_tokens"), "model": self.model, "output": [],
               "parallel_tool_calls": True, "temperature": self.req.sampling.get("temperature"),
               "top_p": self.req.sampling.get("top_p"), "tool_choice": "auto", "tools": [],
               "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
               "metadata": self.body.get("metadata") or {}, "user": self.req.user, "usage": None}
        if result is None:
            return out
        incomplete = result.finish_reason == "length"
        out.update(status="incomplete" if incomplete else "completed",
                   incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
                   output=[self.message(result.text)], usage=self.usage(result),
                   speculative=responses.speculative(self.method, [result]))
        return out

    def usage(self, result: GenerationResult) -> dict:
        output = len(result.token_ids)
        return {"input_tokens": self.req.prompt_tokens,
                "input_tokens_details": {"cached_tokens": result.stats.cached_prompt_tokens},
                "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.req.prompt_tokens + output}

    def event(self, kind: str, **fields) -> str:
        """One server-sent event, numbered."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [self.event("response.created", response=self.response(None)),
                self.event("response.in_progress", response=self.response(None)),
                self.event("response.output_item.added", output_index=0, item=self.message(None)),
                self.event("response.content_part.added", **where, part=self.part(""))]

    def delta(self, text: str) -> str:
        return self.event("response.output_text.delta", item_id=self.message_id, output_index=0, content_index=0,
                          delta=text, logprobs=[])

    def closing(self, result: GenerationResult) -> list[str]:
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        final = self.response(result)
        return [self.event("response.output_text.done", **where, text=result.text, logprobs=[]),
                self.event("response.content_part.done", **where, part=self.part(result.text)),
                self.event("response.output_item.done", output_index=0, item=self.message(result.text)),
                self.event(f"response.{final['status']}", response=final)]

    def error(self, error: ApiError) -> str:
        return self.event("error", code=error.code, message=error.message, param=error.param)


async def stream(job, writer: ResponseWriter):
    """The events of a streamed response, from the chat job's events."""
    try:
        for event in writer.opening():
            yield event
        while True:
            event = await job.next_event()
            if event.kind == "end":
                break
            if event.kind == "error":
                yield writer.error(event.error)
                continue
            if event.text:
                yield writer.delta(event.text)
            if event.kind == "done":
                for out in writer.closing(event.result):
                    yield out
    finally:
        if not job.finished:
            job.cancel()
