"""The OpenAI-compatible HTTP app: create_app(decoder, settings) -> FastAPI.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
GET /health, GET /metrics. Every error, including unknown routes and wrong methods, comes back
in the OpenAI envelope {"error": {"message", "type", "param", "code"}}. With an API key set,
every route but /health needs "Authorization: Bearer <key>".

Besides the OpenAI fields, responses carry a `speculative` object (totals over the response's
choices): {method, drafted_tokens, accepted_tokens, num_drafts, mean_accepted_length,
acceptance_rate}. In a stream it rides on the last chunk before [DONE] (the usage chunk when
stream_options.include_usage is set, else the last choice's finish chunk)."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from specdec.engine import GenerationStats
from specdec.server.chat import ChatTemplate
from specdec.server.errors import ApiError, error_response
from specdec.server.metrics import Metrics
from specdec.server.validation import GenerationRequest, RequestParser, parse_json_object
from specdec.server.worker import EngineWorker, Job, QueueFull

log = logging.getLogger("specdec.server")

MAX_BODY_BYTES = 1 << 20  # 1 MiB
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
METHODS = ("GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")


@dataclass
class ServerSettings:
    model_name: str | None = None  # default: the target folder's name
    api_key: str | None = None  # None: no authentication
    max_queue: int = 64  # requests waiting for the engine; more -> 429
    max_tokens_limit: int | None = 4096  # largest max_tokens accepted (None: the context window)
    max_body_bytes: int = MAX_BODY_BYTES


class Gateway:
    """Pure ASGI middleware (safe for streaming): API key check and request metrics."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app = app
        self.api_key = settings.api_key.encode() if settings.api_key else None
        self.metrics = metrics

    def _authorized(self, scope) -> bool | None:
        """None when no key was sent, else whether it is the right one."""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return False
                return hmac.compare_digest(token.strip(), self.api_key)
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = (path if path in ENDPOINTS
                    else "/v1/models/{model}" if path.startswith("/v1/models/") else "other")
        method = scope.get("method", "")
        method = method if method in METHODS else "other"
        status = 500
        start = time.perf_counter()

        async def send_and_watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            ok = True if self.api_key is None or path == "/health" else self._authorized(scope)
            if ok:
                await self.app(scope, receive, send_and_watch)
            else:
                message = ("missing API key: send it as 'Authorization: Bearer <key>'" if ok is None
                           else "invalid API key")
                error = ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error_response(error)(scope, receive, send_and_watch)
        finally:
            self.metrics.observe_request(endpoint, method, status, time.perf_counter() - start)


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


async def watch_disconnect(request: Request, job: Job) -> None:
    """For non-streamed responses: cancel the job if the client goes away while it waits."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.client_gone = True
            job.cancel()
            return


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(decoder, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    target_path = getattr(decoder, "target_path", None)
    served_name = settings.model_name or (target_path.name if target_path is not None else "specdec")
    method = decoder.method
    engine = decoder.engine
    metrics = Metrics(max_positions=getattr(engine, "max_draft_tokens", 0) if method != "none" else 0)
    worker = EngineWorker(decoder, settings.max_queue, metrics)
    parser = RequestParser(decoder, served_name, settings.max_tokens_limit,
                           ChatTemplate.from_tokenizer_config(decoder.tokenizer.config))
    started_at = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        await run_in_threadpool(worker.stop)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.decoder = decoder
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.worker = worker
    app.state.served_name = served_name
    app.state.parser = parser
    app.add_middleware(Gateway, settings=settings, metrics=metrics)
    worker.start()  # also serve when run without lifespan events (e.g. some test clients)

    # ---- errors: everything in the OpenAI envelope ----
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            message, code = f"no route for {request.method} {request.url.path}", "not_found"
        elif exc.status_code == 405:
            message, code = (f"method {request.method} is not allowed on {request.url.path}",
                             "method_not_allowed")
        else:
            message, code = str(exc.detail), None
        return error_response(ApiError(exc.status_code, message, code=code, headers=exc.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(ApiError(400, f"{where or 'request'}: {first.get('msg', 'invalid request')}",
                                       param=where or None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, "internal server error", code="internal_error"))

    # ---- generation ----
    def model_card() -> dict:
        return {"id": served_name, "object": "model", "created": started_at, "owned_by": "specdec",
                "max_model_len": engine.context_window, "speculative_method": method}

    def speculative(results) -> dict:
        stats = GenerationStats.merge([r.stats for r in results])
        return {"method": method, "drafted_tokens": stats.drafted_tokens,
                "accepted_tokens": stats.accepted_tokens,
                "num_drafts": sum(1 for r in results for k in r.stats.draft_tokens_per_step if k > 0),
                "mean_accepted_length": stats.mean_accepted_length,
                "acceptance_rate": stats.acceptance_rate, "lossy": stats.lossy}

    def usage(req: GenerationRequest, results) -> dict:
        completion = sum(len(r.token_ids) for r in results)
        return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": completion,
                "total_tokens": len(req.prompt_ids) + completion}

    async def generate(request: Request, req: GenerationRequest):
        job = Job(req.prompt_ids, req.samplings(), req.stream, asyncio.get_running_loop())
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(429, f"the server is busy: {settings.max_queue} requests are already waiting; "
                                "retry later", code="queue_full", headers={"Retry-After": "1"}) from None
        chat = req.kind == "chat"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            return JobStreamingResponse(job, stream_events(job, req, rid, created),
                                        media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(watch_disconnect(request, job))
        results = [None] * req.n
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
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": r.text},
                        "logprobs": None, "finish_reason": r.finish_reason} for i, r in enumerate(results)]
        else:
            choices = [{"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
                       for i, r in enumerate(results)]
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": served_name, "choices": choices,
                             "usage": usage(req, results), "speculative": speculative(results)})

    async def stream_events(job: Job, req: GenerationRequest, rid: str, created: int):
        chat = req.kind == "chat"
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": served_name}

        def text_choice(index, text, finish=None):
            if chat:
                return {"index": index, "delta": {"content": text} if text else {}, "logprobs": None,
                        "finish_reason": finish}
            return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}

        results = [None] * req.n
        role_sent = set()
        try:
            while True:
                event = await job.next_event()
                if event.kind == "end":
                    break
                if event.kind == "error":
                    yield sse(event.error.body())
                    continue
                i = event.index
                if chat and i not in role_sent:
                    role_sent.add(i)
                    yield sse({**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]})
                if event.kind == "chunk":
                    yield sse({**base, "choices": [text_choice(i, event.text)]})
                elif event.kind == "done":
                    results[i] = event.result
                    if chat and event.text:
                        yield sse({**base, "choices": [text_choice(i, event.text)]})
                    last = {**base, "choices": [text_choice(i, "" if chat else event.text,
                                                            event.result.finish_reason)]}
                    if i == req.n - 1 and not req.include_usage:
                        last["speculative"] = speculative([r for r in results if r is not None])
                    yield sse(last)
            if req.include_usage and all(r is not None for r in results):
                yield sse({**base, "choices": [], "usage": usage(req, results),
                           "speculative": speculative(results)})
            yield "data: [DONE]\n\n"
        finally:
            if not job.finished:
                job.cancel()

    @app.post("/v1/completions")
    async def completions(request: Request):
        raw = await read_body(request, settings.max_body_bytes)
        req = await run_in_threadpool(lambda: parser.completion(parse_json_object(raw)))
        return await generate(request, req)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        raw = await read_body(request, settings.max_body_bytes)
        req = await run_in_threadpool(lambda: parser.chat(parse_json_object(raw)))
        return await generate(request, req)

    # ---- the rest ----
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != served_name:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {served_name!r}",
                           param="model", code="model_not_found")
        return model_card()

    @app.get("/health")
    async def health():
        if not worker.alive:
            raise ApiError(503, "the engine worker is not running", code="worker_down")
        return {"status": "ok", "model": served_name}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), headers={"Content-Type": metrics.content_type})

    return app
