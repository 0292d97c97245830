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
reason, where the non-streamed reply is that whole text as content.

Over 300 lines: one character-level reader, whose parts all share its scanning state."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

OPEN, CLOSE = "<tool_call>", "</tool_call>"
SPACE = " \t\n\r"  # JSON's whitespace


def call_id(seed: str, index: int) -> str:
    """A call's id: derived from the response (seed) and the call's index, so the streamed
    and the parsed reading of one reply name each call alike."""
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]


class Malformed(Exception):
    """The text after <tool_call> is not (the beginning of) calls parse_calls accepts."""


@dataclass
class Call:
    id: str
    start: int  # where its object opens in the text
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    args_text: str | None = None  # set once the object closed: "{}" when it had no arguments
    header_sent: bool = False
    args_sent: int = 0  # characters of its arguments already sent

    def unsent(self, text: str, scanned: int) -> str:
        """The arguments' text written since the last fragment (all of it once the object closed)."""
        if self.args_text is not None:
            return self.args_text[self.args_sent:]
        return "" if self.args_start is None else text[self.args_start + self.args_sent:self.args_end or scanned]


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
        self.names = {t.name for t in settings.tools}
        self.parallel = settings.parallel
        self.seed = seed
        self.text = ""
        self.mode = "content"  # -> "calls" at <tool_call> -> "after" the JSON; "plain" | "broken" on failure
        self.sent = 0  # content characters released
        self.open_at = -1
        self.pos = 0  # next character to scan
        self.stack: list[str] = []  # open brackets of the JSON
        self.string_at = -1  # where the string being read opened (-1: not in a string)
        self.escaped = False
        self.expect = "start"  # what the call-level JSON needs next
        self.key: str | None = None
        self.keys: set[str] = set()
        self.calls: list[Call] = []
        self.body_end = -1
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
                self._char(self.text[self.pos])
                self.pos += 1
            if self.mode == "after" and not self._may_close():
                raise Malformed
        except Malformed:
            return self._fail()
        return self._released() if self.mode in ("calls", "after") else []

    def _char(self, c: str) -> None:
        if self.string_at >= 0:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self._string(self.text[self.string_at:self.pos + 1])
                self.string_at = -1
        elif c == '"':
            self.string_at = self.pos
        elif c in "[{":
            self._open(c)
        elif c in "]}":
            self._close(c)
        elif c in ",:":
            self._punctuation(c)
        elif c not in SPACE:
            self._scalar()

    def _member_depth(self) -> int:
        """The depth of a call object's members: 2 inside a list of calls, 1 for a lone call."""
        return 2 if self.stack[:1] == ["["] else 1

    def _at_members(self) -> bool:
        return bool(self.stack) and len(self.stack) == self._member_depth()

    def _open(self, c: str) -> None:
        depth = len(self.stack)
        if depth == 0:  # the body: a list of calls, or one call
            _need(self.expect == "start")
            if c == "{":
                self._start_call()
            else:
                self.expect = "element"
        elif depth == 1 and self.stack[0] == "[":
            _need(c == "{" and self.expect == "element")
            self._start_call()
        elif depth == self._member_depth():  # a member's value
            _need(self.expect == "value")
            if self.key == "arguments":
                _need(c == "{")
                self.calls[-1].args_start = self.pos
            _need(self.key != "name")
            self.expect = "after"
        self.stack.append(c)

    def _start_call(self) -> None:
        self.calls.append(Call(call_id(self.seed, len(self.calls)), self.pos))
        self.expect, self.key, self.keys = "key", None, set()

    def _close(self, c: str) -> None:
        _need(bool(self.stack) and self.stack.pop() == {"]": "[", "}": "{"}[c])
        depth = len(self.stack)
        call = self.calls[-1] if self.calls else None
        if depth == self._member_depth() and call is not None and call.args_start is not None \
                and call.args_end is None:
            call.args_end = self.pos + 1
        elif depth == self._member_depth() - 1 and c == "}":
            _need(self.expect == "after" or (self.expect == "key" and not self.keys))
            self._end_call(call)
        elif depth == 0:  # the list of calls
            _need(self.expect == "separator")
        if depth == 0:
            self.mode, self.body_end = "after", self.pos + 1

    def _end_call(self, call: Call) -> None:
        """A call object closed: it must be JSON naming a tool, its arguments an object."""
        try:
            obj = json.loads(self.text[call.start:self.pos + 1])
        except ValueError:
            raise Malformed from None
        _need(call.name is not None and isinstance(obj.get("arguments", {}), dict))
        call.args_text = self.text[call.args_start:call.args_end] if call.args_start is not None else "{}"
        self.expect = "separator"

    def _string(self, raw: str) -> None:
        if not self._at_members():
            _need(len(self.stack) > self._member_depth())  # a string inside some member's value
            return
        try:
            value = json.loads(raw)
        except ValueError:
            raise Malformed from None
        if self.expect == "key":
            _need(value not in self.keys or value not in ("name", "arguments"))
            self.key = value
            self.keys.add(value)
            self.expect = "colon"
            return
        _need(self.expect == "value" and self.key != "arguments")
        if self.key == "name":
            _need(value in self.names)
            self.calls[-1].name = value
        self.expect = "after"

    def _punctuation(self, c: str) -> None:
        depth = len(self.stack)
        if depth > self._member_depth():
            return
        if depth == self._member_depth():
            _need((c, self.expect) in ((":", "colon"), (",", "after")))
            self.expect = "value" if c == ":" else "key"
        else:
            _need(c == "," and self.expect == "separator" and depth == 1)
            self.expect = "element"

    def _scalar(self) -> None:
        """A number, true, false or null: only inside values, never a name or arguments."""
        if len(self.stack) > self._member_depth():
            return
        _need(self._at_members() and (self.expect == "value" and self.key not in ("name", "arguments")
                                      or self.expect == "after" and self.text[self.pos - 1] not in SPACE + ",:"))
        self.expect = "after"

    # ------------------------------------------------------------ after the JSON

    def _may_close(self) -> bool:
        """Whether the text after the JSON can still become whitespace and </tool_call>."""
        rest = self.text[self.body_end:].lstrip(SPACE)
        return rest.startswith(CLOSE) or CLOSE.startswith(rest)

    def _closed_properly(self) -> bool:
        """parse_calls' rule: whitespace, then </tool_call> or the end of the reply."""
        rest = self.text[self.body_end:].lstrip(SPACE)
        try:
            json.loads(self.text[self.open_at + len(OPEN):self.body_end])
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


def _need(condition: bool) -> None:
    if not condition:
        raise Malformed


def _content_end(text: str, sent: int) -> int:
    """How far content can be released: not into a suffix that may begin <tool_call>, nor
    into trailing whitespace (cut if a call follows)."""
    end = len(text) - next((n for n in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:n])), 0)
    return sent + len(text[sent:end].rstrip())  # text[sent:] is what is held back: short
