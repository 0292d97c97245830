"""The JSON objects the server sends: model cards, completion and chat objects, stream chunks,
`usage` and the `speculative` object, and logprobs in OpenAI's two shapes (chat:
{content: [{token, logprob, bytes, top_logprobs}], refusal}; completions: {tokens,
token_logprobs, top_logprobs, text_offset}, text_offset counting characters from the start of
the prompt). Pure functions of finished results, no I/O, but for ChoiceStream: the state of
one streamed choice (what was sent so far).

`speculative` (totals over the response's choices): {method, drafted_tokens,
accepted_tokens, num_drafts, mean_accepted_length, acceptance_rate, lossy}. In a stream it
rides on the last chunk before [DONE] (the usage chunk when stream_options.include_usage is
set, else the last choice's finish chunk)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from specdec import __version__
from specdec.chat.tool_stream import CallStream
from specdec.chat.tools import parse_calls
from specdec.engine.sequence import GenerationResult, StreamChunk
from specdec.sampling.logprobs import TextOffsets, TokenLogprob, TokenTexts
from specdec.server.request import GenerationRequest
from specdec.stats import GenerationStats

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def model_card(served_name: str, created: int, context_window: int, method: str) -> dict:
    return {"id": served_name, "object": "model", "created": created, "owned_by": "specdec",
            "max_model_len": context_window, "speculative_method": method}


def speculative(method: str, results: Sequence[GenerationResult]) -> dict:
    stats = GenerationStats.merge([r.stats for r in results])
    return {"method": method, "drafted_tokens": stats.drafted_tokens, "accepted_tokens": stats.accepted_tokens,
            "num_drafts": stats.num_drafts, "mean_accepted_length": stats.mean_accepted_length,
            "acceptance_rate": stats.acceptance_rate, "lossy": stats.lossy}


def system_fingerprint(method: str) -> str:
    """Which build and configuration answered (OpenAI: changes when results may change)."""
    return f"specdec-{__version__}-{method}"


def usage(req: GenerationRequest, results: Sequence[GenerationResult]) -> dict:
    """OpenAI's usage, with its details: speculation fills the predicted-output fields (drafted
    tokens the target accepted / rejected); cached: prompt tokens whose cache entries an earlier
    generation left (each prompt counted once, by its first choice); no reasoning tokens."""
    completion = sum(len(r.token_ids) for r in results)
    cached = sum(r.stats.cached_prompt_tokens for r in results[::req.n])
    accepted = sum(r.stats.accepted_tokens for r in results)
    rejected = sum(r.stats.drafted_tokens for r in results) - accepted
    return {"prompt_tokens": req.prompt_tokens, "completion_tokens": completion,
            "total_tokens": req.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": rejected}}


def running_usage(req: GenerationRequest, completion_tokens: int) -> dict:
    """`usage` on every stream chunk (stream_options.continuous_usage_stats): tokens so far."""
    return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": completion_tokens,
            "total_tokens": len(req.prompt_ids) + completion_tokens}


@dataclass(frozen=True)
class ResponseHeader:
    """What every object of one response shares."""
    id: str
    created: int
    model: str
    chat: bool
    method: str  # the decoder's speculative method
    tokens: TokenTexts | None = None  # token text and bytes, for logprobs

    def fields(self, object_type: str) -> dict:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.model,
                "system_fingerprint": system_fingerprint(self.method)}


# ---------------------------------------------------------------- logprobs

class ChoiceLogprobs:
    """The logprobs object(s) of one choice, written all at once or chunk by chunk: `sent`
    counts the generated tokens already written, text offsets continue across chunks."""

    def __init__(self, head: ResponseHeader, req: GenerationRequest, index: int):
        self.chat, self.texts, self.req = head.chat, head.tokens, req
        self.prompt_in = req.prompt_of(index)  # the choice's prompt
        self.sent = 0
        self.offsets = TextOffsets(len(self.prompt_in.text))

    def _entry(self, token: int) -> dict:
        return {"token": self.texts.text(token), "logprob": None, "bytes": list(self.texts.token_bytes(token))}

    def _chat(self, entries: Sequence[TokenLogprob]) -> dict:
        content = [{**self._entry(e.token), "logprob": e.logprob,
                    "top_logprobs": [{**self._entry(t), "logprob": lp} for t, lp in e.top]} for e in entries]
        return {"content": content, "refusal": None}

    def _legacy(self, tokens: Sequence[int], entries: Sequence[TokenLogprob | None], offsets: TextOffsets) -> dict:
        """Completions: the N most likely and the chosen token per position (up to N+1, as
        OpenAI); a prompt's first token has no distribution (null)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, e in zip(tokens, entries):
            out["tokens"].append(self.texts.text(token))
            out["text_offset"].append(offsets.next(self.texts.token_bytes(token)))
            out["token_logprobs"].append(None if e is None else e.logprob)
            top = None
            if e is not None:
                top = {self.texts.text(t): lp for t, lp in e.top}
                top.setdefault(self.texts.text(e.token), e.logprob)
            out["top_logprobs"].append(top)
        return out

    def prompt(self, entries: Sequence[TokenLogprob | None] | None) -> dict:
        """Completions with echo: the prompt's tokens, offsets from 0."""
        ids = self.prompt_in.ids
        return self._legacy(ids, entries or [None] * len(ids), TextOffsets(0))

    def take(self, tokens: Sequence[int], entries: Sequence[TokenLogprob]) -> dict:
        """The next generated tokens."""
        self.sent += len(entries)
        return self._chat(entries) if self.chat else self._legacy(tokens, entries, self.offsets)

    def rest(self, result: GenerationResult) -> dict:
        """The generated tokens not written yet."""
        return self.take(result.token_ids[self.sent:], (result.token_logprobs or [])[self.sent:])


def _joined(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}


def choice_logprobs(head: ResponseHeader, req: GenerationRequest, result: GenerationResult,
                    index: int) -> dict | None:
    """A whole choice's logprobs object (None when not asked for)."""
    if req.logprobs is None:
        return None
    writer = ChoiceLogprobs(head, req, index)
    generated = writer.rest(result)
    return _joined(writer.prompt(result.prompt_logprobs), generated) if req.echo else generated


def call_seed(head: ResponseHeader, index: int) -> str:
    """What a choice's tool-call ids derive from: the same in its stream as in parse_calls."""
    return f"{head.id}:{index}"


def chat_message(head: ResponseHeader, req: GenerationRequest, result: GenerationResult,
                 index: int) -> tuple[dict, str]:
    """The assistant message and finish reason of a chat choice: with tools, a reply that calls
    them becomes tool_calls (finish_reason "tool_calls")."""
    if req.tools is None:
        return {"role": "assistant", "content": result.text}, result.finish_reason
    content, calls = parse_calls(result.text, req.tools, call_seed(head, index))
    if calls is None:
        return {"role": "assistant", "content": result.text}, result.finish_reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def completion_object(head: ResponseHeader, req: GenerationRequest, results: Sequence[GenerationResult]) -> dict:
    """The whole (non-streamed) response."""
    if head.chat:
        messages = [chat_message(head, req, r, i) for i, r in enumerate(results)]
        choices = [{"index": i, "message": messages[i][0],
                    "logprobs": choice_logprobs(head, req, r, i), "finish_reason": messages[i][1]}
                   for i, r in enumerate(results)]
    else:
        choices = [{"index": i, "text": (req.prompt_of(i).text if req.echo else "") + r.text,
                    "logprobs": choice_logprobs(head, req, r, i),
                    "finish_reason": r.finish_reason} for i, r in enumerate(results)]
    return {**head.fields("chat.completion" if head.chat else "text_completion"), "choices": choices,
            "usage": usage(req, results), "speculative": speculative(head.method, results)}


def _chunk(head: ResponseHeader, choices: list[dict]) -> dict:
    return {**head.fields("chat.completion.chunk" if head.chat else "text_completion"), "choices": choices}


def _text_choice(head: ResponseHeader, index: int, text: str, finish: str | None = None,
                 logprobs: dict | None = None) -> dict:
    if head.chat:
        return {"index": index, "delta": {"content": text} if text else {}, "logprobs": logprobs,
                "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def role_chunk(head: ResponseHeader, index: int) -> dict:
    """A chat choice's first chunk: the assistant role, no text yet."""
    return _chunk(head, [{"index": index, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}])


def text_chunk(head: ResponseHeader, index: int, text: str) -> dict:
    return _chunk(head, [_text_choice(head, index, text)])


def finish_chunk(head: ResponseHeader, index: int, text: str, finish_reason: str) -> dict:
    """A choice's last chunk. Chat sends the final text in a text chunk before it, completions in it."""
    return _chunk(head, [_text_choice(head, index, "" if head.chat else text, finish_reason)])


def usage_chunk(head: ResponseHeader, req: GenerationRequest, results: Sequence[GenerationResult]) -> dict:
    """The last chunk when stream_options.include_usage is set: no choices."""
    return {**_chunk(head, []), "usage": usage(req, results), "speculative": speculative(head.method, results)}


def tool_delta(event: tuple) -> dict:
    """A chat delta from a CallStream event: content, a call's first delta (index, id, type,
    name, empty arguments) or a fragment of its arguments (index and the fragment only)."""
    if event[0] == "content":
        return {"content": event[1]}
    if event[0] == "call":
        _, j, call_id, name = event
        return {"tool_calls": [{"index": j, "id": call_id, "type": "function",
                                "function": {"name": name, "arguments": ""}}]}
    _, j, fragment = event
    return {"tool_calls": [{"index": j, "function": {"arguments": fragment}}]}


class ChoiceStream:
    """The chunks of one choice of a streamed response, in order: chat's role chunk or the
    echoed prompt first, then text (with the logprobs of the tokens each step added), then
    the finish. With tools offered, chat's text goes through a CallStream: content as usual,
    the markup of a call never, its name and arguments as tool_calls deltas as they are
    written (tool_stream.py)."""

    def __init__(self, head: ResponseHeader, req: GenerationRequest, index: int):
        self.head, self.req, self.index = head, req, index
        self.started = False
        active = head.chat and req.tools is not None and req.tools.active
        self.calls = CallStream(req.tools, call_seed(head, index)) if active else None
        self.logprobs = ChoiceLogprobs(head, req, index) if req.logprobs is not None else None

    def opening(self, chunk: StreamChunk | None, result: GenerationResult | None) -> list[dict]:
        """Before the choice's first event: chat's role chunk; completions' echoed prompt."""
        if self.started:
            return []
        self.started = True
        if self.head.chat:
            return [role_chunk(self.head, self.index)]
        if not self.req.echo:
            return []
        logprobs = None
        if self.logprobs is not None:
            source = chunk if chunk is not None and chunk.prompt_logprobs is not None else result
            logprobs = self.logprobs.prompt(source.prompt_logprobs if source is not None else None)
        return [_chunk(self.head, [_text_choice(self.head, self.index, self.req.prompt_of(self.index).text,
                                                logprobs=logprobs)])]

    def step(self, text: str, chunk: StreamChunk | None) -> list[dict]:
        """A decode step's text and the logprobs of its tokens (either may be empty)."""
        logprobs = None
        if self.logprobs is not None and chunk is not None and chunk.token_logprobs:
            logprobs = self.logprobs.take(chunk.token_ids, chunk.token_logprobs)
        if self.calls is not None:
            return self._deltas(self.calls.feed(text), logprobs)
        if not text and logprobs is None:
            return []
        return [_chunk(self.head, [_text_choice(self.head, self.index, text, logprobs=logprobs)])]

    def _deltas(self, events: list[tuple], logprobs: dict | None) -> list[dict]:
        """A chunk per CallStream event, the step's logprobs on the first (or alone)."""
        deltas = [tool_delta(e) for e in events] or ([{}] if logprobs is not None else [])
        return [_chunk(self.head, [{"index": self.index, "delta": delta, "logprobs": logprobs if j == 0 else None,
                                    "finish_reason": None}]) for j, delta in enumerate(deltas)]

    def finish(self, text: str, result: GenerationResult) -> list[dict]:
        """The last text and logprobs, and the finish reason (chat: in a chunk of its own)."""
        logprobs = None
        if self.logprobs is not None and self.logprobs.sent < len(result.token_ids):
            logprobs = self.logprobs.rest(result)
        if not self.head.chat:
            return [_chunk(self.head, [_text_choice(self.head, self.index, text, result.finish_reason, logprobs)])]
        finish = result.finish_reason
        if self.calls is not None:
            out = self._deltas(self.calls.feed(text) + self.calls.finish(), logprobs)
            return out + [finish_chunk(self.head, self.index, "", "tool_calls" if self.calls.ok else finish)]
        out = [_chunk(self.head, [_text_choice(self.head, self.index, text, logprobs=logprobs)])] \
            if text or logprobs is not None else []
        return out + [finish_chunk(self.head, self.index, text, finish)]
