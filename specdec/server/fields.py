"""Reading single JSON values out of a request body, by hand and without coercion.

"1" where a number is expected, a boolean where an integer is expected, an out-of-range
value: each becomes a 400 whose message names the parameter, says what was expected (the
Bounds' requirement, shared with specdec/sampling.py) and shows what was received."""
from __future__ import annotations

import json

from specdec.sampling import Bounds
from specdec.server.errors import ApiError, bad_request


def short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(value) -> str:
    """How a received JSON value is shown in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, str):
        return f"a string ({short(json.dumps(value))})"
    if isinstance(value, int):
        return short(str(value))
    if isinstance(value, float):
        return short(repr(value))
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def parse_json_object(raw: bytes) -> dict:
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, huge integers
        raise bad_request(f"the request body is not valid JSON: {short(str(e), 200)}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {describe(body)}")
    return body


def check_text(value: str, param: str) -> str:
    """JSON may carry lone surrogates (\\ud800), which are not text the tokenizer can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} is not valid Unicode text (it holds a lone surrogate)", param) from None
    return value


def get_number(body: dict, name: str, bounds: Bounds, default: float | None) -> float | int | None:
    """body[name] checked against bounds (an int for integer bounds, else a float); default
    when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not bounds.accepts(value):
        raise bad_request(f"{name} must be {bounds.requirement}, got {describe(value)}", name)
    return value if bounds.integer else float(value)


def get_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean (true or false), got {describe(value)}", name)
    return value


def get_str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{name} must be a string, got {describe(value)}", name)
    return value


def check_model(body: dict, served_name: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {describe(model)}", "model")
    if model != served_name:
        raise model_not_found(model, served_name)


def model_not_found(model: str, served_name: str) -> ApiError:
    return ApiError(404, f"the model {model!r} does not exist; this server serves {served_name!r}",
                    param="model", code="model_not_found")
