"""Request parsing and validation for /v1/completions and /v1/chat/completions.

The JSON body is parsed and checked here by hand (no coercion): "1" where a number is expected,
a boolean where an integer is expected, an out-of-range value, all become a 400 whose message
names the parameter and says what was expected and what was received."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from specdec.server.chat import ChatTemplate, ChatTemplateError
from specdec.server.errors import ApiError, bad_request

MAX_N = 8
MAX_STOP = 4
MAX_STOP_CHARS = 1000  # a stop string is matched against the text's tail every step
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 63 - 1
DEFAULT_COMPLETION_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint
CHAT_ROLES = ("system", "developer", "user", "assistant")

# Accepted only at their "off" value: anything else is refused instead of silently ignored.
UNSUPPORTED = {
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "logit_bias": ({},),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "chat_template": (),  # only the model's own template is ever rendered
}


@dataclass
class GenerationRequest:
    kind: str  # "completion" | "chat"
    prompt_ids: list[int]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    sampling: dict = field(default_factory=dict)  # SamplingParams fields except seed
    seed: int | None = None
    user: str | None = None

    def samplings(self) -> list[dict]:
        """Per-choice sampling arguments: choice i uses seed + i when a seed is given."""
        return [{**self.sampling, "seed": None if self.seed is None else self.seed + i}
                for i in range(self.n)]


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(value) -> str:
    """How a received JSON value is shown in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, str):
        return f"a string ({_short(json.dumps(value))})"
    if isinstance(value, int):
        return _short(str(value))
    if isinstance(value, float):
        return _short(repr(value))
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_float(v) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer too large for a float
        return math.inf if v > 0 else -math.inf


def check_text(value: str, param: str) -> str:
    """JSON may carry lone surrogates (\\ud800), which are not text the tokenizer can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} is not valid Unicode text (it holds a lone surrogate)", param) from None
    return value


def get_float(body: dict, name: str, default: float, ok, requirement: str) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v):
        raise bad_request(f"{name} must be {requirement}, got {describe(v)}", name)
    f = _as_float(v)
    if not math.isfinite(f) or not ok(f):
        raise bad_request(f"{name} must be {requirement}, got {describe(v)}", name)
    return f


def get_int(body: dict, name: str, default: int | None, ok, requirement: str) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v) or not ok(v):
        raise bad_request(f"{name} must be {requirement}, got {describe(v)}", name)
    return v


def get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{name} must be a boolean (true or false), got {describe(v)}", name)
    return v


def get_str(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"{name} must be a string, got {describe(v)}", name)
    return v


def parse_json_object(raw: bytes) -> dict:
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, huge integers
        raise bad_request(f"the request body is not valid JSON: {_short(str(e), 200)}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {describe(body)}")
    return body


def check_model(body: dict, served_name: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {describe(model)}", "model")
    if model != served_name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {served_name!r}",
                       param="model", code="model_not_found")


def check_unsupported(body: dict) -> None:
    for name, off_values in UNSUPPORTED.items():
        v = body.get(name)
        if v is None or any(type(v) is type(o) and v == o for o in off_values) or (
                _is_number(v) and any(_is_number(o) and v == o for o in off_values)):
            continue
        raise bad_request(f"{name} is not supported by this server (got {describe(v)})", name)
    best_of = body.get("best_of")
    n = body.get("n") if body.get("n") is not None else 1
    if best_of is not None and not (_is_int(best_of) and best_of == n):
        raise bad_request(f"best_of is not supported by this server (got {describe(best_of)})", "best_of")


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


def get_stream_options(body: dict, stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad_request(f"stream_options must be an object, got {describe(opts)}", "stream_options")
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    return get_bool(opts, "include_usage", False) if "include_usage" in opts else False


class RequestParser:
    """Turns a raw body into a GenerationRequest for one loaded decoder."""

    def __init__(self, decoder, served_name: str, max_tokens_limit: int | None,
                 chat_template: ChatTemplate):
        self.tokenizer = decoder.tokenizer
        self.context_window = decoder.engine.context_window
        self.vocab_size = getattr(decoder.engine.target, "vocab_size", None) or self.tokenizer.vocab_size
        self.served_name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.chat_template = chat_template

    # ---- shared parameters ----
    def _common(self, body: dict, kind: str) -> GenerationRequest:
        check_model(body, self.served_name)
        check_unsupported(body)
        n = get_int(body, "n", 1, lambda v: 1 <= v <= MAX_N, f"an integer in [1, {MAX_N}]")
        stream = get_bool(body, "stream", False)
        include_usage = get_stream_options(body, stream)
        sampling = dict(
            temperature=get_float(body, "temperature", 1.0, lambda v: v >= 0, "a finite number >= 0"),
            top_p=get_float(body, "top_p", 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]"),
            top_k=get_int(body, "top_k", 0, lambda v: v >= 0, "an integer >= 0 (0 = off)"),
            min_p=get_float(body, "min_p", 0.0, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
            stop=get_stop(body),
        )
        seed = get_int(body, "seed", None, lambda v: SEED_MIN <= v <= SEED_MAX,
                       "an integer in [-2^63, 2^63 - 1]")
        user = get_str(body, "user")
        return GenerationRequest(kind, [], n, stream, include_usage, sampling, seed, user)

    def _max_tokens(self, body: dict, names: tuple[str, ...], prompt_len: int, default: int | None,
                    prompt_param: str) -> int:
        room = self.context_window - prompt_len
        if room < 1:
            raise bad_request(f"the prompt has {prompt_len} tokens; the model's context window is "
                              f"{self.context_window} tokens, so no room is left for the completion",
                              prompt_param, "context_length_exceeded")
        name = next((nm for nm in names if body.get(nm) is not None), names[0])
        limit = self.max_tokens_limit
        value = get_int(body, name, None, lambda v: v >= 1, "an integer >= 1")
        if value is None:
            value = min(room, default if default is not None else room, limit or room)
            return value
        if limit is not None and value > limit:
            raise bad_request(f"{name} is {value}; this server allows at most {limit} "
                              "(--max-tokens-limit)", name)
        if value > room:
            raise bad_request(f"the prompt has {prompt_len} tokens and {name} is {value}: together "
                              f"{prompt_len + value} tokens, more than the model's context window of "
                              f"{self.context_window} tokens; shorten the prompt or lower {name}",
                              name, "context_length_exceeded")
        return value

    def _check_ids(self, ids: list, param: str) -> list[int]:
        for t in ids:
            if not _is_int(t) or not 0 <= t < self.vocab_size:
                raise bad_request(f"{param} token ids must be integers in [0, {self.vocab_size}), "
                                  f"got {describe(t)}", param)
        return list(ids)

    def _prompt_ids(self, body: dict) -> list[int]:
        if "prompt" not in body or body["prompt"] is None:
            raise bad_request("missing required parameter 'prompt'", "prompt")
        p = body["prompt"]
        if isinstance(p, list):
            if not p:
                raise bad_request("prompt must not be empty", "prompt")
            if all(isinstance(x, str) for x in p):
                if len(p) > 1:
                    raise bad_request(f"prompt holds {len(p)} strings; batched prompts are not supported, "
                                      "send one prompt per request", "prompt")
                p = p[0]
            elif all(_is_int(x) for x in p):
                return self._check_ids(p, "prompt")
            elif len(p) == 1 and isinstance(p[0], list) and p[0]:
                return self._check_ids(p[0], "prompt")
            else:
                raise bad_request("prompt must be a string, an array with one string, or an array of "
                                  "token ids", "prompt")
        if not isinstance(p, str):
            raise bad_request(f"prompt must be a string, an array with one string, or an array of "
                              f"token ids, got {describe(p)}", "prompt")
        if not p:
            raise bad_request("prompt must not be empty", "prompt")
        ids = self.tokenizer.encode(check_text(p, "prompt"))
        if not ids:
            raise bad_request("prompt must not be empty (it encodes to no tokens)", "prompt")
        return ids

    def _messages(self, body: dict) -> list[dict]:
        msgs = body.get("messages")
        if msgs is None:
            raise bad_request("missing required parameter 'messages'", "messages")
        if not isinstance(msgs, list):
            raise bad_request(f"messages must be an array of message objects, got {describe(msgs)}",
                              "messages")
        if not msgs:
            raise bad_request("messages must hold at least one message", "messages")
        out = []
        for i, m in enumerate(msgs):
            where = f"messages[{i}]"
            if not isinstance(m, dict):
                raise bad_request(f"{where} must be an object with 'role' and 'content', got {describe(m)}",
                                  where)
            role = m.get("role")
            if role not in CHAT_ROLES:
                roles = ", ".join(repr(r) for r in CHAT_ROLES)
                shown = "missing" if role is None else describe(role) if not isinstance(role, str) \
                    else repr(_short(role))
                raise bad_request(f"{where}.role must be one of {roles}, got {shown}", f"{where}.role")
            content = m.get("content")
            if isinstance(content, list):
                parts = []
                for j, part in enumerate(content):
                    if not (isinstance(part, dict) and part.get("type") == "text"
                            and isinstance(part.get("text"), str)):
                        raise bad_request(f"{where}.content[{j}] must be a text part "
                                          "{\"type\": \"text\", \"text\": \"...\"} (other content types "
                                          "are not supported)", f"{where}.content")
                    parts.append(part["text"])
                content = "".join(parts)
            elif not isinstance(content, str):
                raise bad_request(f"{where}.content must be a string or an array of text parts, got "
                                  f"{'missing' if 'content' not in m else describe(content)}",
                                  f"{where}.content")
            msg = {"role": role, "content": check_text(content, f"{where}.content")}
            name = m.get("name")
            if name is not None:
                if not isinstance(name, str):
                    raise bad_request(f"{where}.name must be a string, got {describe(name)}", f"{where}.name")
                msg["name"] = check_text(name, f"{where}.name")
            out.append(msg)
        return out

    # ---- endpoints ----
    def completion(self, body: dict) -> GenerationRequest:
        req = self._common(body, "completion")
        req.prompt_ids = self._prompt_ids(body)
        req.sampling["max_new_tokens"] = self._max_tokens(
            body, ("max_tokens",), len(req.prompt_ids), DEFAULT_COMPLETION_MAX_TOKENS, "prompt")
        return req

    def chat(self, body: dict) -> GenerationRequest:
        req = self._common(body, "chat")
        messages = self._messages(body)
        try:
            text = self.chat_template.render(messages)
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
        req.prompt_ids = self.tokenizer.encode(text)
        if not req.prompt_ids:
            raise bad_request("the messages render to an empty prompt", "messages")
        req.sampling["max_new_tokens"] = self._max_tokens(
            body, ("max_completion_tokens", "max_tokens"), len(req.prompt_ids),
            self.max_tokens_limit, "messages")
        return req
