"""The OpenAI-compatible HTTP app: create_app(decoder, settings) -> FastAPI.

Wiring only: the shared ServerState (state.py), the routes (routes.py), the Gateway
middleware (API key and request metrics), the worker's lifespan and the error handlers.
Every error, including unknown routes and wrong methods, comes back in the OpenAI envelope
{"error": {"message", "type", "param", "code"}}. With an API key set, every route but
/health needs "Authorization: Bearer <key>".

No handler for FastAPI's RequestValidationError: routes read raw bodies and declare no
typed parameters (the one path parameter is a str), so FastAPI never validates anything."""
from __future__ import annotations

import hmac
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine.decoder import SpecDecoder
from specdec.server.errors import ApiError, error_response
from specdec.server.metrics import Metrics
from specdec.server.routes import router
from specdec.server.state import MAX_BODY_BYTES, ServerSettings, ServerState

__all__ = ["MAX_BODY_BYTES", "ServerSettings", "create_app"]

log = logging.getLogger("specdec.server")

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/infill", "/v1/models", "/health",
             "/metrics")
REPLICA_HEADER = b"x-specdec-replica"
METHODS = ("GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")


class Gateway:
    """Pure ASGI middleware (safe for streaming): API key check, request metrics, and on a replica
    of several the X-Specdec-Replica header on every response."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app = app
        self.api_key = settings.api_key.encode() if settings.api_key else None
        self.metrics = metrics
        self.replica_header = (REPLICA_HEADER, settings.replica_id.encode()) if settings.replica_id else None

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
                if self.replica_header:
                    message = dict(message, headers=[*message.get("headers", ()), self.replica_header])
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


async def _api_error(request: Request, exc: ApiError):
    return error_response(exc)


async def _http_error(request: Request, exc: StarletteHTTPException):
    """Starlette's own 404 (no route) and 405 (wrong method), in the OpenAI envelope."""
    if exc.status_code == 404:
        message, code = f"no route for {request.method} {request.url.path}", "not_found"
    elif exc.status_code == 405:
        message, code = f"method {request.method} is not allowed on {request.url.path}", "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    return error_response(ApiError(exc.status_code, message, code=code, headers=exc.headers))


async def _internal_error(request: Request, exc: Exception):
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(ApiError(500, "internal server error", code="internal_error"))


def create_app(decoder: SpecDecoder, settings: ServerSettings | None = None) -> FastAPI:
    state = ServerState.build(decoder, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app):
        state.worker.start()
        yield
        await run_in_threadpool(state.worker.stop)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.state.served_name = state.served_name  # what `specdec serve` prints
    app.add_middleware(Gateway, settings=state.settings, metrics=state.metrics)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.include_router(router)
    state.worker.start()  # also serve when run without lifespan events (e.g. some test clients)
    return app
