"""Errors in the OpenAI envelope: {"error": {"message", "type", "param", "code"}}.

Every error the server sends, whatever its status (400, 401, 404, 405, 413, 429, 500, 503),
goes through `error_response`, so clients can always read `error.message`."""
from __future__ import annotations

import json

from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",  # the client closed the request (only ever seen in metrics)
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the server refuses; becomes an error envelope with this status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


class AsciiJSONResponse(JSONResponse):
    """Escapes non-ASCII: an error message may quote client input, even a lone surrogate."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(error: ApiError) -> JSONResponse:
    return AsciiJSONResponse(error.body(), status_code=error.status, headers=error.headers)
