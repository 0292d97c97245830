"""What the loop (engine/scheduler.py) hands its callers: the chunks of a step, one request's
stream (a batch of one: SpecDecoder.generate and stream), and offline batches of requests."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from specdec.engine.scheduler import Scheduler, StepEvent
from specdec.engine.sequence import GenerationResult, StreamChunk
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import last_entries


def stream_chunks(batch: Scheduler, event: StepEvent) -> list[StreamChunk]:
    """The chunks of this step of the sequence: one per step, and when the sequence finished,
    a last one with its result (carrying the step's tokens when EOS or a stop string ended it)."""
    seq, step = event.seq, event.step
    if step is None:
        return []
    prompt_logprobs = seq.prompt_logprobs if seq.stats.target_forwards == 1 else None  # with the first chunk
    chunks = []
    if not step.stopped:
        chunks.append(StreamChunk(step.text, list(step.new_tokens), step=step, prompt_logprobs=prompt_logprobs,
                                  token_logprobs=last_entries(seq.token_logprobs, len(step.new_tokens))))
        prompt_logprobs = None
    if seq.finish_reason is not None:
        result, tail = batch.finish(seq)
        last = step if step.stopped else None
        tokens = list(step.new_tokens) if last is not None else []
        chunks.append(StreamChunk((step.text if last is not None else "") + tail, tokens, result, step=last,
                                  token_logprobs=last_entries(seq.token_logprobs, len(tokens)),
                                  prompt_logprobs=prompt_logprobs))
    return chunks


def stream(batch: Scheduler, prompt: str | list[int], params: SamplingParams, method: str | None = None
           ) -> Iterator[StreamChunk]:
    """One request through the loop alone (the batch must be empty): a chunk per step; the last
    chunk carries the result (and, when EOS or a stop string ended the generation, that step's
    tokens). Closing the iterator early frees the slot."""
    if len(batch):
        raise SpecdecError("a lone request needs an empty batch; this one is busy")
    seq = batch.add(prompt, params, method)
    try:
        while seq.finish_reason is None:
            for event in batch.step():
                yield from stream_chunks(batch, event)
    finally:
        if seq.finish_reason is None:
            batch.cancel(seq)


def generate_one(batch: Scheduler, prompt: str | list[int], params: SamplingParams,
                 method: str | None = None) -> GenerationResult:
    result = None
    for chunk in stream(batch, prompt, params, method):
        result = chunk.result
    return result


def generate_all(batch: Scheduler, requests: Iterable[tuple[str | list[int], SamplingParams, str | None]]
                 ) -> list[GenerationResult]:
    """Run (prompt, params, method) requests through the batch, admitting a waiting request
    whenever a slot frees; results in request order."""
    waiting = list(enumerate(requests))
    for _, (prompt, _, method) in waiting:  # fail before any work
        batch.engine.encode_prompt(prompt)
        batch.drafting.check_method(method or batch.method)
    waiting.reverse()
    index: dict[int, int] = {}
    results: list[GenerationResult | None] = [None] * len(waiting)
    while waiting or len(batch):
        while waiting and batch.free_slots:
            i, (prompt, params, method) = waiting.pop()
            index[id(batch.add(prompt, params, method))] = i
        for event in batch.step():
            if event.seq.finish_reason is not None:
                results[index.pop(id(event.seq))] = batch.finish(event.seq)[0]
    return results
