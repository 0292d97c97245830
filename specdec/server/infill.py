"""POST /infill: llama.cpp server's fill-in-the-middle endpoint, the request editors' plugins
send (llama.vim, llama.vscode): input_prefix, input_suffix, input_extra (other files' chunks),
prompt (text the middle already starts with), n_predict and llama.cpp's sampling names and
defaults. The answer has llama.cpp's /completion shape (content, stop, stop_type, timings, ...);
streamed, one `data:` line per decode step and a last one with stop: true.

Long inputs are cut to fit the context window as llama.cpp does (fim.fim_prompt: the oldest
extra chunks first, then the prefix's start and the suffix's end), and `truncated` says so.
t_max_predict_ms is honoured (SamplingParams.line_time_limit); cache_prompt, id_slot,
t_max_prompt_ms, n_indent and samplers are accepted and have no effect (samplers: the order
here is fixed: penalties, top-k, top-p, min-p, temperature)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from specdec.chat.fim import FimPrompt, FimTokens, fim_prompt
from specdec.engine.sequence import GenerationResult
from specdec.errors import SpecdecError
from specdec.sampling import SAMPLING_BOUNDS, Bounds
from specdec.server.errors import bad_request
from specdec.server.fields import check_model, check_text, describe, get_bool, get_number, get_stop
from specdec.server.request import GenerationRequest, Prompt
from specdec.server.validation import RequestParser

MAX_EXTRA = 64  # input_extra chunks
DEFAULT_RESERVE = 256  # tokens kept free for the middle when n_predict is -1 (until EOS)
# llama.cpp's request names -> SamplingParams fields, with llama.cpp server's defaults
SAMPLING = (("temperature", "temperature", 0.8), ("top_k", "top_k", 40), ("top_p", "top_p", 0.95),
            ("min_p", "min_p", 0.05), ("repeat_penalty", "repetition_penalty", 1.0),
            ("presence_penalty", "presence_penalty", 0.0), ("frequency_penalty", "frequency_penalty", 0.0))
N_PREDICT = Bounds(-1, integer=True, note="-1 = until the end of the middle")
SEED = Bounds(-1, 2 ** 63 - 1, integer=True, text="an integer in [-1, 2^63 - 1] (-1 = random)")
T_MAX_PREDICT = Bounds(0, integer=True, note="0 = no limit")
TEXT_FIELDS = ("input_prefix", "input_suffix", "prompt")


def _text(body: dict, name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string, got {describe(value)}", name)
    return check_text(value, name)


def _extra(body: dict) -> list[tuple[str, str]]:
    chunks = body.get("input_extra")
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise bad_request(f"input_extra must be an array of {{\"filename\", \"text\"}} objects, "
                          f"got {describe(chunks)}", "input_extra")
    if len(chunks) > MAX_EXTRA:
        raise bad_request(f"input_extra holds {len(chunks)} chunks; at most {MAX_EXTRA} are allowed", "input_extra")
    out = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise bad_request(f"input_extra[{i}] must be an object with \"filename\" and \"text\", "
                              f"got {describe(chunk)}", "input_extra")
        name, text = chunk.get("filename", ""), chunk.get("text")
        if not isinstance(name, str) or not isinstance(text, str):
            raise bad_request(f"input_extra[{i}] needs \"text\" (a string) and an optional \"filename\" "
                              "(a string)", "input_extra")
        out.append((check_text(name, "input_extra"), check_text(text, "input_extra")))
    return out


def _response_fields(body: dict) -> list[str] | None:
    fields = body.get("response_fields")
    if fields is None:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise bad_request(f"response_fields must be an array of strings, got {describe(fields)}",
                          "response_fields")
    return fields


@dataclass(frozen=True)
class InfillRequest:
    """A checked /infill body: the generation request and what the response reports."""
    req: GenerationRequest
    prompt: FimPrompt
    n_predict: int  # as asked (-1: until the end of the middle)
    fields: list[str] | None  # response_fields


def parse_infill(parser: RequestParser, body: dict, fim: FimTokens | None) -> InfillRequest:
    """body -> InfillRequest for the loaded model; fim: its FimTokens (None: a 400)."""
    check_model(body, parser.served_name)
    if fim is None:
        raise bad_request("this server's model has no fill-in-the-middle tokens, so /infill cannot be served; "
                          "serve a code model trained for infilling (such as qwen-coder)", code="fim_not_supported")
    prefix, suffix, typed = (_text(body, name) for name in TEXT_FIELDS)
    extra = _extra(body)
    n_predict = body.get("n_predict", body.get("max_tokens"))
    n_predict = get_number({"n_predict": n_predict}, "n_predict", N_PREDICT, -1)
    if n_predict == 0:
        raise bad_request("n_predict must be -1 (until the end of the middle) or at least 1, got 0", "n_predict")
    window, limit = parser.context_window, parser.max_tokens_limit
    if limit is not None and n_predict > limit:
        raise bad_request(f"n_predict is {n_predict}; this server allows at most {limit} (--max-tokens-limit)",
                          "n_predict")
    sampling = {field: get_number(body, key, SAMPLING_BOUNDS[field], default) for key, field, default in SAMPLING}
    stop = get_stop(body)
    seed = get_number(body, "seed", SEED, -1)
    t_max = get_number(body, "t_max_predict_ms", T_MAX_PREDICT, 0)
    stream = get_bool(body, "stream", False)
    fields = _response_fields(body)
    reserve = n_predict if n_predict > 0 else min(limit or DEFAULT_RESERVE, DEFAULT_RESERVE, window // 2)
    if reserve >= window:
        raise bad_request(f"n_predict is {n_predict}: the model's context window of {window} tokens leaves no "
                          "room for the prompt", "n_predict", "context_length_exceeded")
    try:
        prompt = fim_prompt(parser.tokenizer, fim, prefix, suffix, extra, typed, budget=window - reserve)
    except SpecdecError as e:
        raise bad_request(str(e), "prompt", "context_length_exceeded") from None
    room = window - len(prompt.ids)
    max_new = n_predict if n_predict > 0 else min(room, limit or room)
    sampling.update(max_new_tokens=max_new, stop=stop, stop_token_ids=prompt.stop_token_ids)
    if t_max:
        sampling["line_time_limit"] = t_max / 1000
    req = GenerationRequest("completion", [Prompt(prompt.ids)], 1, stream, sampling=sampling,
                            seed=None if seed == -1 else seed)
    return InfillRequest(req, prompt, n_predict, fields)


def stop_type(result: GenerationResult, stop: tuple[str, ...], full_text: str) -> tuple[str, str]:
    """llama.cpp's stop_type ("eos", "word" or "limit") and the stop string that ended the text.
    full_text: the decoded tokens, of which result.text is the part before any stop string."""
    if result.finish_reason != "stop":
        return "limit", ""
    tail = full_text[len(result.text):]
    word = next((s for s in stop if tail.startswith(s)), "")
    return ("word", word) if word else ("eos", "")


def response(inf: InfillRequest, result: GenerationResult, model: str, method: str, full_text: str,
             streamed: bool = False) -> dict:
    """The final object (llama.cpp's /completion shape), with `speculative` added; streamed: the
    last event of a stream, whose content and tokens were sent before."""
    stats, req = result.stats, inf.req
    prompt_n, predicted_n = len(inf.prompt.ids), len(result.token_ids)
    computed = prompt_n - stats.cached_prompt_tokens  # timings.prompt_n: the prompt tokens processed
    prompt_ms = stats.prefill_seconds * 1000
    predicted_ms = max(stats.wall_seconds - stats.prefill_seconds, 0.0) * 1000
    kind, word = stop_type(result, req.sampling["stop"], full_text)
    out = {
        "index": 0, "content": "" if streamed else result.text, "tokens": [] if streamed else result.token_ids,
        "id_slot": 0, "stop": True,
        "model": model, "tokens_predicted": predicted_n, "tokens_evaluated": prompt_n,
        "generation_settings": {"n_predict": inf.n_predict, "seed": req.seed if req.seed is not None else -1,
                                **{k: v for k, v in req.sampling.items()
                                   if k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                            "presence_penalty", "frequency_penalty")},
                                "stop": list(req.sampling["stop"]), "speculative_method": method},
        "has_new_line": "\n" in result.text, "truncated": inf.prompt.truncated,
        "stop_type": kind, "stopping_word": word, "tokens_cached": stats.cached_prompt_tokens,
        "timings": {"prompt_n": computed, "prompt_ms": prompt_ms,
                    "prompt_per_token_ms": prompt_ms / computed if computed else 0.0,
                    "prompt_per_second": 1000 * computed / prompt_ms if prompt_ms else 0.0,
                    "predicted_n": predicted_n, "predicted_ms": predicted_ms,
                    "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
                    "predicted_per_second": 1000 * predicted_n / predicted_ms if predicted_ms else 0.0},
        "speculative": {"method": method, "drafted_tokens": stats.drafted_tokens,
                        "accepted_tokens": stats.accepted_tokens},
    }
    return select_fields(out, inf.fields)


def select_fields(out: dict, fields: list[str] | None) -> dict:
    """llama.cpp's response_fields: only these, "a/b" read from out["a"]["b"] and kept under the
    key "a/b"; a missing field is left out."""
    if fields is None:
        return out
    picked = {}
    for path in fields:
        value = out
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            picked[path] = value
    return picked


def chunk(text: str, token_ids: list[int]) -> str:
    """One streamed step (llama.cpp's shape)."""
    return sse({"index": 0, "content": text, "tokens": token_ids, "stop": False})


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"

