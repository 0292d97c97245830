"""The HTTP routes. Handlers find the app's ServerState on request.app.state.server.

POST /v1/completions, POST /v1/chat/completions (and POST /v1/responses, through the chat
path: responses_api.py): the body is read raw (at most settings.max_body_bytes) and checked
by validation.RequestParser, never by FastAPI, so no route declares a body or typed
parameter; the job goes to the engine worker and its events come back as one JSON object or
as server-sent events.
POST /infill: llama.cpp server's fill-in-the-middle request and answer (infill.py), for editors.
GET /v1/models, /v1/models/{id}, /health, /metrics."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from specdec.sampling.logprobs import token_texts
from specdec.server import infill, responses, responses_api
from specdec.server.errors import ApiError
from specdec.server.fields import model_not_found, parse_json_object
from specdec.server.jobs import Job, QueueFull
from specdec.server.request import GenerationRequest
from specdec.server.responses import ResponseHeader
from specdec.server.state import ServerState
from specdec.server.validation import RequestParser

router = APIRouter()


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def parse_and_generate(request: Request, parse: Callable[[RequestParser, dict], GenerationRequest]):
    state = server_state(request)
    raw = await read_body(request, state.settings.max_body_bytes)
    req = await run_in_threadpool(lambda: parse(state.parser, parse_json_object(raw)))
    return await generate(request, state, req)


@router.post("/v1/completions")
async def completions(request: Request):
    return await parse_and_generate(request, RequestParser.completion)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await parse_and_generate(request, RequestParser.chat)


@router.post("/v1/responses")
async def create_response(request: Request):
    """The Responses API, answered by the chat path (responses_api.py)."""
    state = server_state(request)
    body = parse_json_object(await read_body(request, state.settings.max_body_bytes))

    def parse() -> GenerationRequest:
        try:
            return state.parser.chat(responses_api.chat_body(body))
        except ApiError as e:
            raise responses_api.renamed(e) from None

    req = await run_in_threadpool(parse)
    job = submit(state, req)
    writer = responses_api.ResponseWriter(body, req, state.served_name, state.decoder.method)
    if req.stream:
        return event_stream(job, responses_api.stream(job, writer))
    return JSONResponse(writer.response((await collect(request, job, 1))[0]))


@router.post("/infill")
async def fill_in_the_middle(request: Request):
    """llama.cpp's /infill (what llama.vim and llama.vscode send): its request and answer shapes."""
    state = server_state(request)
    raw = await read_body(request, state.settings.max_body_bytes)
    inf = await run_in_threadpool(
        lambda: infill.parse_infill(state.parser, parse_json_object(raw), state.decoder.fim_tokens()))
    job = submit(state, inf.req)
    if inf.req.stream:
        return event_stream(job, infill_events(job, inf, state))
    result = (await collect(request, job, 1))[0]
    return JSONResponse(infill_answer(inf, result, state))


def infill_answer(inf: infill.InfillRequest, result, state: ServerState, streamed: bool = False) -> dict:
    return infill.response(inf, result, state.served_name, state.decoder.method,
                           state.decoder.tokenizer.decode(result.token_ids), streamed)


async def infill_events(job: Job, inf: infill.InfillRequest, state: ServerState):
    """llama.cpp's stream: a `data:` object per step, the last one whole with stop: true; no [DONE]."""
    async for event in job_events(job):
        if event.kind == "error":
            yield infill.sse(event.error.body())
        elif event.kind == "chunk" and (event.text or event.chunk.token_ids):
            yield infill.chunk(event.text, event.chunk.token_ids)
        elif event.kind == "done":
            if event.text:
                yield infill.chunk(event.text, [])
            yield infill.sse(infill_answer(inf, event.result, state, streamed=True))


def _model_card(state: ServerState) -> dict:
    decoder = state.decoder
    return responses.model_card(state.served_name, state.started_at, decoder.context_window, decoder.method)


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [_model_card(server_state(request))]}


@router.get("/v1/models/{model:path}")
async def model(request: Request, model: str):
    state = server_state(request)
    if model != state.served_name:
        raise model_not_found(model, state.served_name)
    return _model_card(state)


@router.get("/health")
async def health(request: Request):
    state = server_state(request)
    if not state.worker.alive:
        raise ApiError(503, "the engine worker is not running", code="worker_down")
    health = {"status": "ok", "model": state.served_name}
    if state.settings.replica_id:
        health["replica"] = state.settings.replica_id
    return health


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    metrics = server_state(request).metrics
    return Response(metrics.render(), headers={"Content-Type": metrics.content_type})


# ---------------------------------------------------------------- generation

async def read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(413, f"the request body is larger than the limit of {limit} bytes",
                         code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise ApiError(400, "the Content-Length header is not a number") from None
        if declared > limit:
            raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected while sending the request") from None
    return b"".join(chunks)


def submit(state: ServerState, req: GenerationRequest) -> Job:
    """The request's job, queued for the engine worker (a 429 when the queue is full)."""
    job = Job(req.prompt_ids, req.sampling_params(), req.stream, asyncio.get_running_loop(),
              prompts=[req.prompt_of(i).ids for i in range(req.num_choices)], prompt_tokens=req.prompt_tokens)
    try:
        state.worker.submit(job)
    except QueueFull:
        raise ApiError(429, f"the server is busy: {state.settings.max_queue} requests are already waiting; "
                            "retry later", code="queue_full", headers={"Retry-After": "1"}) from None
    return job


def event_stream(job: Job, events) -> Response:
    return JobStreamingResponse(job, events, media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def generate(request: Request, state: ServerState, req: GenerationRequest) -> Response:
    job = submit(state, req)
    chat = req.kind == "chat"
    head = ResponseHeader(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()),
                          state.served_name, chat, state.decoder.method,
                          token_texts(state.decoder.tokenizer) if req.logprobs is not None else None)
    if req.stream:
        return event_stream(job, stream_events(job, req, head))
    return JSONResponse(responses.completion_object(head, req, await collect(request, job, req.num_choices)))


async def collect(request: Request, job: Job, n: int) -> list:
    """The n finished results of a non-streamed job (cancelled if the client goes away)."""
    watcher = asyncio.create_task(watch_disconnect(request, job))
    results = [None] * n  # n: the number of choices
    error = None
    try:
        while True:
            event = await job.next_event()
            if event.kind == "done":
                results[event.index] = event.result
            elif event.kind == "error":
                error = event.error
            elif event.kind == "end":
                break
    finally:
        watcher.cancel()
        if not job.finished:
            job.cancel()
    if error is not None:
        raise error
    if any(r is None for r in results):
        if job.client_gone:  # nobody reads this; 499 (client closed request) is for the metrics
            raise ApiError(499, "the client disconnected", code="client_disconnected")
        raise ApiError(503, "the generation was cancelled", code="cancelled")
    return results


async def watch_disconnect(request: Request, job: Job) -> None:
    """For non-streamed responses: cancel the job if the client goes away while it waits."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.client_gone = True
            job.cancel()
            return


async def job_events(job: Job):
    """The job's events up to its "end"."""
    while True:
        event = await job.next_event()
        if event.kind == "end":
            return
        yield event


async def stream_events(job: Job, req: GenerationRequest, head: ResponseHeader):
    """Server-sent events of a streamed job, ending with [DONE]."""
    results = [None] * req.num_choices
    choices = [responses.ChoiceStream(head, req, i) for i in range(req.num_choices)]
    generated = [0] * req.num_choices  # tokens so far per choice (continuous usage stats)

    def sse(obj: dict) -> str:
        if req.continuous_usage:
            obj["usage"] = responses.running_usage(req, sum(generated))
        return responses.sse(obj)

    try:
        async for event in job_events(job):
            if event.kind == "error":
                yield responses.sse(event.error.body())
                continue
            i = event.index
            for obj in choices[i].opening(event.chunk, event.result):
                yield sse(obj)
            generated[i] = event.generated
            if event.kind == "chunk":
                for obj in choices[i].step(event.text, event.chunk):
                    yield sse(obj)
            elif event.kind == "done":
                results[i] = event.result
                *objs, last = choices[i].finish(event.text, event.result)
                for obj in objs:
                    yield sse(obj)
                if i == req.num_choices - 1 and not req.include_usage:
                    last["speculative"] = responses.speculative(head.method, [r for r in results if r is not None])
                yield sse(last)
        if req.include_usage and all(r is not None for r in results):
            yield responses.sse(responses.usage_chunk(head, req, results))
        yield responses.DONE
    finally:
        if not job.finished:
            job.cancel()


class JobStreamingResponse(StreamingResponse):
    """Cancels its job however the response ends (finished, client gone, server error)."""

    def __init__(self, job: Job, content, **kwargs):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()  # no effect once the job has ended
