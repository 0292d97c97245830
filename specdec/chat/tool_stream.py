"""Reading a reply's tool calls as its text grows, so a stream can send each call the way
OpenAI's clients expect: a first delta with the call's index, id, type, name and empty
arguments, then the arguments' JSON text in fragments as the model writes it.

The reply is SmolLM2's format (tools.py): content, then <tool_call>, a JSON list of
{"name", "arguments"} objects (or one such object), then </tool_call>. CallStream scans the
text after <tool_call> character by character (strings, nesting, the keys of each call
object), and only ever releases text no later token can change: content stops short of
anything that may still become <tool_call> and of trailing whitespace (content before a call
is stripped on the right); a call's name is sent once its string is closed and it names a
tool; its arguments are sent as they grow, since text inside the arguments object can only
be extended. Stop strings are the engine's business (TextStream holds their prefixes back).

parse_calls (tools.py) is this same reader run over the whole text, so a streamed reply's
fragments concatenate to the non-streamed `arguments` (the model's own JSON text of the
arguments object) and both carry the same ids. What streaming cannot do is take text back:
a reply whose call turns out malformed after its first delta went out (cut short by
max_tokens; with "auto", also bad JSON, which the grammar of "required" and named calls rules
out) keeps the deltas sent, sends nothing more for it, and finishes with the engine's finish
reason, where the non-streamed reply is that whole text as content. The JSON itself is read by
call_reader.py."""
from __future__ import annotations

import json
from typing import Protocol

from specdec.chat.call_reader import SPACE, CallReader, Malformed

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class OfferedTools(Protocol):
    """What the reader needs of tools.ToolSettings (named here: tools.py imports this module)."""

    @property
    def tools(self) -> tuple: ...

    @property
    def parallel(self) -> bool: ...


class CallStream:
    """The content and tool-call deltas of one reply, fed its text delta by delta. feed and
    finish return events: ("content", text), ("call", index, id, name) and
    ("arguments", index, fragment); after finish, `ok` says whether the reply called tools."""

    def __init__(self, settings: OfferedTools, seed: str):
        self.reader = CallReader({t.name for t in settings.tools}, seed)
        self.calls = self.reader.calls
        self.parallel = settings.parallel
        self.text = ""
        self.mode = "content"  # -> "calls" at <tool_call> -> "after" the JSON; "plain" | "broken" on failure
        self.sent = 0  # content characters released
        self.open_at = -1
        self.pos = 0  # next character to scan
        self.ok = False

    # ------------------------------------------------------------ public

    def feed(self, delta: str) -> list[tuple]:
        self.text += delta
        if self.mode == "plain":
            return self._content(len(self.text))
        events = []
        if self.mode == "content":
            at = self.text.find(OPEN, self.sent)
            if at < 0:
                return self._content(_content_end(self.text, self.sent))
            events = self._content(len(self.text[:at].rstrip()))
            self.mode, self.open_at, self.pos = "calls", at, at + len(OPEN)
        return events + self._scan()

    def finish(self) -> list[tuple]:
        """The rest once the reply is complete, and `ok`."""
        if self.mode in ("content", "plain"):
            return self._content(len(self.text))
        if self.mode == "after" and self._closed_properly():
            self.ok = True
            return []
        return self._fail()

    def content(self) -> str | None:
        """parse_calls' content: the text before the call, right-stripped (None if empty)."""
        return self.text[:self.open_at].rstrip() or None

    def openai_calls(self) -> list[dict]:
        """The calls in OpenAI's shape (after a finish that was ok)."""
        calls = self.calls if self.parallel else self.calls[:1]
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args_text}}
                for c in calls]

    # ------------------------------------------------------------ content

    def _content(self, end: int) -> list[tuple]:
        if end <= self.sent:
            return []
        out, self.sent = self.text[self.sent:end], end
        return [("content", out)]

    def _fail(self) -> list[tuple]:
        """Malformed calls: before any delta went out the whole text is content after all
        (as parse_calls has it); after, nothing more is sent."""
        if any(c.header_sent for c in self.calls):
            self.mode = "broken"
            return []
        self.mode = "plain"
        return self._content(len(self.text))

    # ------------------------------------------------------------ calls

    def _scan(self) -> list[tuple]:
        try:
            while self.pos < len(self.text) and self.mode == "calls":
                if self.reader.read(self.text, self.pos):
                    self.mode = "after"
                self.pos += 1
            if self.mode == "after" and not self._may_close():
                raise Malformed
        except Malformed:
            return self._fail()
        return self._released() if self.mode in ("calls", "after") else []

    # ------------------------------------------------------------ after the JSON

    def _may_close(self) -> bool:
        """Whether the text after the JSON can still become whitespace and </tool_call>."""
        rest = self.text[self.reader.body_end:].lstrip(SPACE)
        return rest.startswith(CLOSE) or CLOSE.startswith(rest)

    def _closed_properly(self) -> bool:
        """parse_calls' rule: whitespace, then </tool_call> or the end of the reply."""
        rest = self.text[self.reader.body_end:].lstrip(SPACE)
        try:
            json.loads(self.text[self.open_at + len(OPEN):self.reader.body_end])
        except ValueError:
            return False
        return rest == "" or rest.startswith(CLOSE)

    def _released(self) -> list[tuple]:
        """Each call's first delta once its name is known, then its arguments as they grow."""
        events = []
        for j, call in enumerate(self.calls):
            if call.name is None or (j > 0 and not self.parallel):
                break
            if not call.header_sent:
                call.header_sent = True
                events.append(("call", j, call.id, call.name))
            fragment = call.unsent(self.text, self.pos)
            if fragment:
                events.append(("arguments", j, fragment))
                call.args_sent += len(fragment)
        return events


def _content_end(text: str, sent: int) -> int:
    """How far content can be released: not into a suffix that may begin <tool_call>, nor
    into trailing whitespace (cut if a call follows)."""
    end = len(text) - next((n for n in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:n])), 0)
    return sent + len(text[sent:end].rstrip())  # text[sent:] is what is held back: short
