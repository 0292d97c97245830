"""Reading single JSON values out of a request body, by hand and without coercion.

"1" where a number is expected, a boolean where an integer is expected, an out-of-range
value: each becomes a 400 whose message names the parameter, says what was expected (the
Bounds' requirement, shared with specdec/sampling.py) and shows what was received."""
from __future__ import annotations

import json

from specdec.sampling import LOGIT_BIAS_BOUNDS, OPTIONAL_BOUNDS, Bounds
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


# the request fields with rules of their own (OpenAI's shapes)
MAX_STOP = 4
MAX_STOP_CHARS = 1000  # a stop string is matched against the text's tail every step
LOGPROBS_BOUNDS = OPTIONAL_BOUNDS["logprobs"]  # chat's top_logprobs, completions' logprobs


def get_stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, list):
        raise bad_request(f"stop must be a string or an array of at most {MAX_STOP} strings, "
                          f"got {describe(stop)}", "stop")
    if len(stop) > MAX_STOP:
        raise bad_request(f"stop may hold at most {MAX_STOP} strings, got {len(stop)}", "stop")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise bad_request(f"stop[{i}] must be a string, got {describe(s)}", "stop")
        if not s:
            raise bad_request("stop strings must not be empty", "stop")
        if len(s) > MAX_STOP_CHARS:
            raise bad_request(f"stop[{i}] has {len(s)} characters; at most {MAX_STOP_CHARS} are allowed", "stop")
        check_text(s, "stop")
    return tuple(stop)


def get_logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    """OpenAI's logit_bias: {"token id": bias}; JSON keys are strings, so ids arrive as digits."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad_request(f"logit_bias must be an object mapping token ids to biases, got {describe(bias)}",
                          "logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise bad_request(f"logit_bias keys must be token ids in [0, {vocab_size}) written as strings, "
                              f"got {short(json.dumps(key))}", "logit_bias")
        if not LOGIT_BIAS_BOUNDS.accepts(value):
            raise bad_request(f"logit_bias values must be {LOGIT_BIAS_BOUNDS.requirement}, got {describe(value)} "
                              f"for token {key}", "logit_bias")
        out[int(key)] = float(value)
    return out


def get_logprobs(body: dict, kind: str) -> int | None:
    """How many alternatives per token the response shows, or None for no logprobs."""
    if kind == "completion":
        return get_number(body, "logprobs", LOGPROBS_BOUNDS, None)
    wanted = get_bool(body, "logprobs", False)
    top = get_number(body, "top_logprobs", LOGPROBS_BOUNDS, None)
    if top and not wanted:
        raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
    return (top or 0) if wanted else None


def get_stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats). The second is vLLM's extension: every chunk
    carries `usage` with the tokens generated so far, so a client (specdec bench-serve) can
    count tokens per chunk when a step sends several."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    if not isinstance(opts, dict):
        raise bad_request(f"stream_options must be an object, got {describe(opts)}", "stream_options")
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    return get_bool(opts, "include_usage", False), get_bool(opts, "continuous_usage_stats", False)
