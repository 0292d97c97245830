"""The JSON objects the server sends: model cards, completion and chat objects, stream chunks,
`usage` and the `speculative` object. Pure functions of finished results, no I/O.

`speculative` (totals over the response's choices): {method, drafted_tokens,
accepted_tokens, num_drafts, mean_accepted_length, acceptance_rate, lossy}. In a stream it
rides on the last chunk before [DONE] (the usage chunk when stream_options.include_usage is
set, else the last choice's finish chunk)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.engine import GenerationResult
from specdec.server.validation import GenerationRequest
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


def usage(req: GenerationRequest, results: Sequence[GenerationResult]) -> dict:
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": completion,
            "total_tokens": len(req.prompt_ids) + completion}


@dataclass(frozen=True)
class ResponseHeader:
    """What every object of one response shares."""
    id: str
    created: int
    model: str
    chat: bool
    method: str  # the decoder's speculative method

    def fields(self, object_type: str) -> dict:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.model}


def completion_object(head: ResponseHeader, req: GenerationRequest, results: Sequence[GenerationResult]) -> dict:
    """The whole (non-streamed) response."""
    if head.chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": r.text},
                    "logprobs": None, "finish_reason": r.finish_reason} for i, r in enumerate(results)]
    else:
        choices = [{"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
                   for i, r in enumerate(results)]
    return {**head.fields("chat.completion" if head.chat else "text_completion"), "choices": choices,
            "usage": usage(req, results), "speculative": speculative(head.method, results)}


def _chunk(head: ResponseHeader, choices: list[dict]) -> dict:
    return {**head.fields("chat.completion.chunk" if head.chat else "text_completion"), "choices": choices}


def _text_choice(head: ResponseHeader, index: int, text: str, finish: str | None = None) -> dict:
    if head.chat:
        return {"index": index, "delta": {"content": text} if text else {}, "logprobs": None,
                "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


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
