"""The JSON after <tool_call> (tool_stream.py), read one character at a time: strings,
nesting and the keys of each call object, so that a call's name is known once its string
closes and its arguments' text can be sent as it grows. Malformed is raised at the first
character no reply parse_calls accepts could hold."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

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


class CallReader:
    """The calls read so far (`calls`), and where the JSON closed (`body_end`; -1 while open)."""

    def __init__(self, names: set[str], seed: str):
        self.names = names  # the tools a call may name
        self.seed = seed
        self.text = ""  # the reply so far
        self.pos = 0  # the character being read
        self.stack: list[str] = []  # open brackets of the JSON
        self.string_at = -1  # where the string being read opened (-1: not in a string)
        self.escaped = False
        self.expect = "start"  # what the call-level JSON needs next
        self.key: str | None = None
        self.keys: set[str] = set()
        self.calls: list[Call] = []
        self.body_end = -1

    def read(self, text: str, pos: int) -> bool:
        """Read text[pos] (text: the reply so far); True once the JSON has closed."""
        self.text, self.pos = text, pos
        self._char(text[pos])
        return self.body_end >= 0

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
            need(self.expect == "start")
            if c == "{":
                self._start_call()
            else:
                self.expect = "element"
        elif depth == 1 and self.stack[0] == "[":
            need(c == "{" and self.expect == "element")
            self._start_call()
        elif depth == self._member_depth():  # a member's value
            need(self.expect == "value")
            if self.key == "arguments":
                need(c == "{")
                self.calls[-1].args_start = self.pos
            need(self.key != "name")
            self.expect = "after"
        self.stack.append(c)

    def _start_call(self) -> None:
        self.calls.append(Call(call_id(self.seed, len(self.calls)), self.pos))
        self.expect, self.key, self.keys = "key", None, set()

    def _close(self, c: str) -> None:
        need(bool(self.stack) and self.stack.pop() == {"]": "[", "}": "{"}[c])
        depth = len(self.stack)
        call = self.calls[-1] if self.calls else None
        if depth == self._member_depth() and call is not None and call.args_start is not None \
                and call.args_end is None:
            call.args_end = self.pos + 1
        elif depth == self._member_depth() - 1 and c == "}":
            need(self.expect == "after" or (self.expect == "key" and not self.keys))
            self._end_call(call)
        elif depth == 0:  # the list of calls
            need(self.expect == "separator")
        if depth == 0:
            self.body_end = self.pos + 1

    def _end_call(self, call: Call) -> None:
        """A call object closed: it must be JSON naming a tool, its arguments an object."""
        try:
            obj = json.loads(self.text[call.start:self.pos + 1])
        except ValueError:
            raise Malformed from None
        need(call.name is not None and isinstance(obj.get("arguments", {}), dict))
        call.args_text = self.text[call.args_start:call.args_end] if call.args_start is not None else "{}"
        self.expect = "separator"

    def _string(self, raw: str) -> None:
        if not self._at_members():
            need(len(self.stack) > self._member_depth())  # a string inside some member's value
            return
        try:
            value = json.loads(raw)
        except ValueError:
            raise Malformed from None
        if self.expect == "key":
            need(value not in self.keys or value not in ("name", "arguments"))
            self.key = value
            self.keys.add(value)
            self.expect = "colon"
            return
        need(self.expect == "value" and self.key != "arguments")
        if self.key == "name":
            need(value in self.names)
            self.calls[-1].name = value
        self.expect = "after"

    def _punctuation(self, c: str) -> None:
        depth = len(self.stack)
        if depth > self._member_depth():
            return
        if depth == self._member_depth():
            need((c, self.expect) in ((":", "colon"), (",", "after")))
            self.expect = "value" if c == ":" else "key"
        else:
            need(c == "," and self.expect == "separator" and depth == 1)
            self.expect = "element"

    def _scalar(self) -> None:
        """A number, true, false or null: only inside values, never a name or arguments."""
        if len(self.stack) > self._member_depth():
            return
        need(self._at_members() and (self.expect == "value" and self.key not in ("name", "arguments")
                                     or self.expect == "after" and self.text[self.pos - 1] not in SPACE + ",:"))
        self.expect = "after"


def need(condition: bool) -> None:
    if not condition:
        raise Malformed
