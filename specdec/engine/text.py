"""Tokenizer loading and incremental detokenization for streaming: text is released only when
it is complete UTF-8 and cannot be the start of a stop string."""
from __future__ import annotations

from pathlib import Path

from specdec.models.checkpoint import ModelSource, open_model


class TextTokenizer:
    """The model's tokenizer (from tokenizer.json, or rebuilt from a GGUF's vocabulary) and its
    tokenizer_config-style settings (`config`: bos/eos token text, chat_template)."""

    def __init__(self, model: str | Path | ModelSource):
        self.tok, self.config = open_model(model).tokenizer()
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)


class TextStream:
    """Turns a growing list of token ids into text deltas, applying stop strings.

    Decoding is incremental (as in vLLM and TGI): only a short window of ids is decoded per
    step, from `prefix` (a few ids of context, so decoders that treat a leading token
    specially give the same text as a full decode) to the end; text is taken once it no
    longer ends in an incomplete UTF-8 character."""

    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:read]
        self.prefix = 0
        self.read = 0
        self.emitted = ""
        self.stopped = False

    def _pending_text(self) -> str:
        """Text of ids[read:], decoded in context (may end in an incomplete character)."""
        done = self.tokenizer.decode(self.ids[self.prefix:self.read])
        return self.tokenizer.decode(self.ids[self.prefix:])[len(done):]

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the newly releasable text (may be empty)."""
        self.ids.extend(new_ids)
        pending = self._pending_text()
        if pending and not pending.endswith("\ufffd"):
            self.text += pending
            self.prefix, self.read = self.read, len(self.ids)
        text = self.text
        for s in self.stop:
            at = text.find(s, max(0, len(self.emitted) - len(s)))
            if at != -1:
                self.stopped = True
                text = text[:at]
        if not self.stopped:
            text = text[:len(text) - self._held_back(text)]
        delta = text[len(self.emitted):] if len(text) > len(self.emitted) else ""
        self.emitted += delta
        return delta

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of text that could begin a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def finish(self) -> str:
        """Release whatever is held back once generation ends."""
        if self.stopped:
            return ""
        text = self.text + self._pending_text()
        delta = text[len(self.emitted):]
        self.emitted += delta
        return delta
