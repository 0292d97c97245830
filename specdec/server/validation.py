"""Request bodies of /v1/completions and /v1/chat/completions -> a GenerationRequest.

Numeric parameters are read from tables: SAMPLING_FIELDS pairs each OpenAI sampling key
with the range the library itself enforces (specdec.sampling.SAMPLING_BOUNDS) and OpenAI's
default; n, seed and the max-token names have server-side rules. A bad value is a 400 that
names the parameter (see fields.py).

logprobs: chat takes `logprobs: true` + `top_logprobs: N`, completions `logprobs: N` (and
`echo`, which with logprobs also scores the prompt); logit_bias keys are token ids written as
strings, checked against the vocabulary. response_format (json_object, json_schema, and the
extensions regex and lark: specdec.sampling.grammar) is compiled here, so a bad schema is a 400."""
from __future__ import annotations

from dataclasses import dataclass

from specdec.chat.fim import fim_prompt, find_fim_tokens
from specdec.chat.template import ChatTemplate, ChatTemplateError
from specdec.chat.tools import ToolSettings, call_grammar, render_messages
from specdec.errors import SpecdecError
from specdec.sampling import (
    SAMPLING_BOUNDS,
    SEED_MODES,
    Bounds,
    is_integer,
    is_number,
)
from specdec.sampling.grammar import Grammar, grammar_from_response_format
from specdec.server.chat import parse_messages, parse_tools
from specdec.server.errors import bad_request
from specdec.server.fields import (
    check_model,
    check_text,
    describe,
    get_bool,
    get_logit_bias,
    get_logprobs,
    get_number,
    get_stop,
    get_str,
    get_stream_options,
    short,
)
from specdec.server.request import GenerationRequest, Prompt

MAX_N = 8
DEFAULT_COMPLETION_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


@dataclass(frozen=True)
class NumericField:
    key: str  # the request's name (OpenAI's)
    bounds: Bounds
    default: float | int | None


# key -> the SamplingParams field of the same name, with the library's own range
SAMPLING_FIELDS = tuple(NumericField(key, SAMPLING_BOUNDS[key], default) for key, default in (
    ("temperature", 1.0),  # OpenAI's default, not the library's greedy 0
    ("top_p", 1.0),
    ("top_k", 0),
    ("min_p", 0.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0),
))
N_FIELD = NumericField("n", Bounds(1, MAX_N, integer=True), 1)
SEED_FIELD = NumericField("seed", Bounds(-(2 ** 63), 2 ** 63 - 1, integer=True,
                                         text="an integer in [-2^63, 2^63 - 1]"), None)
# max_new_tokens: the request's names for it, first present wins; range SAMPLING_BOUNDS'
MAX_TOKENS_KEYS = {"completion": ("max_tokens",), "chat": ("max_completion_tokens", "max_tokens")}

# Accepted only at their "off" value: anything else is refused instead of silently ignored.
UNSUPPORTED = {
    "functions": ([],),  # the deprecated form of tools
    "function_call": ("none",),
    "chat_template": (),  # only the model's own template is ever rendered
}
# Other servers' ways to constrain the output (llama.cpp: json_schema, GBNF grammar; vLLM: guided_*):
# refused with the response_format that does the same here, since ignoring one returns
# unconstrained text to a client that relies on the constraint.
CONSTRAINT_EXTENSIONS = {
    "json_schema": 'response_format {"type": "json_schema", "json_schema": {"schema": ...}}',
    "guided_json": 'response_format {"type": "json_schema", "json_schema": {"schema": ...}}',
    "grammar": 'response_format {"type": "lark", "grammar": ...} (a Lark grammar, not GBNF)',
    "guided_grammar": 'response_format {"type": "lark", "grammar": ...}',
    "guided_regex": 'response_format {"type": "regex", "regex": ...}',
    "guided_choice": 'response_format {"type": "regex", "regex": "a|b|..."}',
}
# the same, for a parameter only the other endpoint takes
UNSUPPORTED_BY_KIND = {
    "completion": {"top_logprobs": (0,), "tools": ([],), "tool_choice": ("none",)},  # completions take logprobs: N
    "chat": {"echo": (False,)},
}


MAX_PROMPTS = 16  # batched completions prompts per request (each gets n choices)


def _is_off(value, off_values: tuple) -> bool:
    return any(type(value) is type(off) and value == off for off in off_values) or (
        is_number(value) and any(is_number(off) and value == off for off in off_values))


def check_unsupported(body: dict, kind: str) -> None:
    for name, off_values in {**UNSUPPORTED, **UNSUPPORTED_BY_KIND[kind]}.items():
        value = body.get(name)
        if value is not None and not _is_off(value, off_values):
            where = "by this endpoint" if name in UNSUPPORTED_BY_KIND[kind] else "by this server"
            raise bad_request(f"{name} is not supported {where} (got {describe(value)})", name)
    for name, instead in CONSTRAINT_EXTENSIONS.items():
        if body.get(name) is not None:
            raise bad_request(f"{name} is another server's extension, not supported here; use {instead}", name)
    best_of = body.get("best_of")
    n = body.get("n") if body.get("n") is not None else 1
    if best_of is not None and not (is_integer(best_of) and best_of == n):
        raise bad_request(f"best_of is not supported by this server (got {describe(best_of)})", "best_of")


class RequestParser:
    """Turns a parsed body into a GenerationRequest for one loaded decoder."""

    def __init__(self, decoder, served_name: str, max_tokens_limit: int | None,
                 chat_template: ChatTemplate):
        self.tokenizer = decoder.tokenizer
        self.context_window = decoder.context_window
        self.vocab_size = decoder.vocab_size
        self.check_grammar = decoder.check_grammar
        self.served_name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.chat_template = chat_template

    def completion(self, body: dict) -> GenerationRequest:
        req = self._common(body, "completion")
        req.prompts = self._prompts(body)
        req.echo = get_bool(body, "echo", False)
        suffix = get_str(body, "suffix")
        if suffix:
            self._fill_in_the_middle(req, check_text(suffix, "suffix"))
        if req.echo and req.logprobs is not None:  # score the prompt too (from the prefill pass)
            req.sampling["prompt_logprobs"] = req.logprobs
        req.sampling["max_new_tokens"] = self._max_tokens(body, req, DEFAULT_COMPLETION_MAX_TOKENS, "prompt")
        return req

    def _fill_in_the_middle(self, req: GenerationRequest, suffix: str) -> None:
        """OpenAI's `suffix`: the prompt is the text before the gap, suffix the text after it;
        the prompt becomes the model's FIM prompt (fim.py), not cut: too long is a 400."""
        fim = find_fim_tokens(self.tokenizer)
        if fim is None:
            raise bad_request("suffix needs a model with fill-in-the-middle tokens; this server's model has "
                              "none", "suffix", "fim_not_supported")
        if len(req.prompts) != 1 or not req.prompts[0].text:
            raise bad_request("suffix needs the prompt as one string (the text before the gap)", "suffix")
        if req.echo:
            raise bad_request("suffix cannot be combined with echo", "suffix")
        prefix = req.prompts[0].text
        prompt = fim_prompt(self.tokenizer, fim, prefix, suffix)
        req.prompts = [Prompt(prompt.ids, prefix)]
        req.sampling["stop_token_ids"] = prompt.stop_token_ids

    def chat(self, body: dict) -> GenerationRequest:
        req = self._common(body, "chat")
        messages = parse_messages(body)
        tools = parse_tools(body)
        openai_tools = None
        if tools is not None:
            req.tools = tools
            messages = render_messages(messages, tools, self.chat_template.takes_tools)
            openai_tools = [t.openai() for t in tools.tools] if tools.active else None
            grammar = call_grammar(tools)
            if grammar is not None:
                if "grammar" in req.sampling:
                    raise bad_request("tool_choice required (or a named function) cannot be combined with "
                                      "response_format", "tool_choice")
                try:
                    self.check_grammar(grammar)
                except SpecdecError as e:
                    raise bad_request(f"a tool's parameters are not a usable JSON schema: {e}", "tools") from None
                req.sampling["grammar"] = grammar
        elif any("tool_calls" in m or m["role"] == "tool" for m in messages):
            messages = render_messages(messages, ToolSettings(()), self.chat_template.takes_tools)
        try:
            text = self.chat_template.render(messages, openai_tools)
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
        req.prompts = [Prompt(self.tokenizer.encode(text))]
        if not req.prompt_ids:
            raise bad_request("the messages render to an empty prompt", "messages")
        req.sampling["max_new_tokens"] = self._max_tokens(body, req, self.max_tokens_limit, "messages")
        return req

    def _common(self, body: dict, kind: str) -> GenerationRequest:
        """Everything but the prompt and max_new_tokens, checked in a fixed order."""
        check_model(body, self.served_name)
        check_unsupported(body, kind)
        n = get_number(body, N_FIELD.key, N_FIELD.bounds, N_FIELD.default)
        stream = get_bool(body, "stream", False)
        include_usage, continuous_usage = get_stream_options(body, stream)
        sampling = {f.key: get_number(body, f.key, f.bounds, f.default) for f in SAMPLING_FIELDS}
        if get_bool(body, "ignore_eos", False):  # an extension (vLLM, llama.cpp): benchmarks' fixed lengths
            sampling["ignore_eos"] = True
        sampling["stop"] = get_stop(body)
        sampling["logit_bias"] = get_logit_bias(body, self.vocab_size)
        grammar = self._grammar(body)
        if grammar is not None:
            sampling["grammar"] = grammar
        logprobs = get_logprobs(body, kind)
        if logprobs is not None:
            sampling["logprobs"] = logprobs
        seed = get_number(body, SEED_FIELD.key, SEED_FIELD.bounds, SEED_FIELD.default)
        seed_mode = get_str(body, "seed_mode")  # an extension: see SamplingParams.seed_mode
        if seed_mode is not None:
            if seed_mode not in SEED_MODES:
                raise bad_request(f"seed_mode must be one of {', '.join(SEED_MODES)}, got {short(seed_mode)!r}",
                                  "seed_mode")
            sampling["seed_mode"] = seed_mode
        user = get_str(body, "user")
        return GenerationRequest(kind, [], n, stream, include_usage, continuous_usage, sampling, seed, user, logprobs)

    def _grammar(self, body: dict) -> Grammar | None:
        try:
            grammar = grammar_from_response_format(body.get("response_format"))
            if grammar is not None:
                self.check_grammar(grammar)  # compiled now: a bad schema is the client's 400
        except SpecdecError as e:
            raise bad_request(str(e), "response_format") from None
        return grammar

    def _max_tokens(self, body: dict, req: GenerationRequest, default: int | None, prompt_param: str) -> int:
        prompt_len = max(len(p.ids) for p in req.prompts)  # the longest prompt must fit
        room = self.context_window - prompt_len
        if room < 1:
            raise bad_request(f"the prompt has {prompt_len} tokens; the model's context window is "
                              f"{self.context_window} tokens, so no room is left for the completion",
                              prompt_param, "context_length_exceeded")
        keys = MAX_TOKENS_KEYS[req.kind]
        name = next((key for key in keys if body.get(key) is not None), keys[0])
        limit = self.max_tokens_limit
        value = get_number(body, name, SAMPLING_BOUNDS["max_new_tokens"], None)
        if value is None:
            return min(room, default if default is not None else room, limit or room)
        if limit is not None and value > limit:
            raise bad_request(f"{name} is {value}; this server allows at most {limit} "
                              "(--max-tokens-limit)", name)
        if value > room:
            raise bad_request(f"the prompt has {prompt_len} tokens and {name} is {value}: together "
                              f"{prompt_len + value} tokens, more than the model's context window of "
                              f"{self.context_window} tokens; shorten the prompt or lower {name}",
                              name, "context_length_exceeded")
        return value

    def _prompts(self, body: dict) -> list[Prompt]:
        """OpenAI's four shapes: a string, an array of strings, an array of token ids, an
        array of token-id arrays; the arrays of strings or of id arrays are batched prompts."""
        if body.get("prompt") is None:
            raise bad_request("missing required parameter 'prompt'", "prompt")
        p = body["prompt"]
        shapes = "a string, an array of strings, an array of token ids or an array of token-id arrays"
        if isinstance(p, str):
            return [self._text_prompt(p, "prompt")]
        if not isinstance(p, list):
            raise bad_request(f"prompt must be {shapes}, got {describe(p)}", "prompt")
        if not p:
            raise bad_request("prompt must not be empty", "prompt")
        if all(is_integer(x) for x in p):
            return [self._ids_prompt(p, "prompt")]
        if not (all(isinstance(x, str) for x in p) or all(isinstance(x, list) for x in p)):
            raise bad_request(f"prompt must be {shapes} (not a mixture)", "prompt")
        if len(p) > MAX_PROMPTS:
            raise bad_request(f"prompt holds {len(p)} prompts; at most {MAX_PROMPTS} are allowed per request",
                              "prompt")
        return [self._text_prompt(x, f"prompt[{i}]") if isinstance(x, str) else self._ids_prompt(x, f"prompt[{i}]")
                for i, x in enumerate(p)]

    def _text_prompt(self, text: str, where: str) -> Prompt:
        if not text:
            raise bad_request(f"{where} must not be empty", "prompt")
        ids = self.tokenizer.encode(check_text(text, "prompt"))
        if not ids:
            raise bad_request(f"{where} must not be empty (it encodes to no tokens)", "prompt")
        return Prompt(ids, text)

    def _ids_prompt(self, ids: list, where: str) -> Prompt:
        if not ids:
            raise bad_request(f"{where} must not be empty", "prompt")
        ids = self._check_ids(ids, where)
        return Prompt(ids, self.tokenizer.decode(ids))

    def _check_ids(self, ids: list, where: str = "prompt") -> list[int]:
        for t in ids:
            if not is_integer(t) or not 0 <= t < self.vocab_size:
                raise bad_request(f"{where} token ids must be integers in [0, {self.vocab_size}), "
                                  f"got {describe(t)}", "prompt")
        return list(ids)
