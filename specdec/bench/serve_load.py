"""Load on an OpenAI-compatible server: C clients in a closed loop, each sending streamed
requests one after another, and what they saw (time to first token, the gaps between tokens,
tokens/s in aggregate). `specdec bench-serve` drives it; it knows nothing of specdec's models,
so it measures any server that speaks /v1/completions or /v1/chat/completions (specdec's,
llama.cpp's llama-server, vLLM).

Tokens are counted from the stream itself. Requests ask for `stream_options.include_usage` and
`continuous_usage_stats` (vLLM's extension, which specdec's server implements): a chunk carrying
`usage` says how many tokens were generated so far, so a speculative step that sends several
tokens in one chunk counts them all. A chunk with text but no usage counts as one token (llama-
server sends one token per chunk, accepted drafts included); a final usage that reports more
adds the rest to the last chunk. The per-token latency (ITL) spreads each chunk's gap over its
tokens: a chunk of k tokens arriving g seconds after the previous one gives k samples of g/k.

A failed request (HTTP error, error object in the stream, broken or unfinished stream, timeout)
is counted and reported, never fatal: its client goes on with its next request."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np

from specdec.errors import SpecdecError

APIS = ("completions", "chat")
MAX_ERROR_SAMPLES = 5


@dataclass
class Endpoint:
    """Where to send requests: base URL (with or without /v1), model id, optional key."""
    url: str
    model: str
    api_key: str | None = None
    api: str = "completions"  # "completions" | "chat"
    extra_body: dict = field(default_factory=dict)  # server-specific fields (llama.cpp's cache_prompt)

    @property
    def base(self) -> str:
        return base_url(self.url)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class LoadSpec:
    max_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = True  # fixed output lengths (specdec, llama.cpp and vLLM take it)
    timeout: float = 600.0  # seconds per request


@dataclass
class RequestRecord:
    """One request as its client saw it; times in seconds from the level's start."""
    prompt_index: int
    start: float
    end: float = 0.0
    ok: bool = False
    error: str | None = None
    tokens: int = 0  # generated tokens (the stream's usage when it reports one)
    events: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens) per token-carrying chunk

    @property
    def ttft(self) -> float | None:
        return self.events[0][0] - self.start if self.events else None

    def itl(self) -> list[float]:
        """Per-token gaps: chunk i (k tokens, g seconds after chunk i-1) gives k samples of g/k."""
        out = []
        for (t0, _), (t1, k) in zip(self.events, self.events[1:]):
            out += [(t1 - t0) / k] * k
        return out

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.tokens < 2 or not self.events:
            return None
        return (self.events[-1][0] - self.events[0][0]) / (self.tokens - 1)


@dataclass
class LevelReport:
    """What one concurrency level measured. Latencies in milliseconds."""
    target: str
    concurrency: int
    requests: int
    completed: int
    errors: int
    output_tokens: int  # of completed requests
    wall_seconds: float
    tokens_per_second: float  # aggregate: output tokens / wall time
    requests_per_second: float
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    mean_tokens_per_chunk: float | None = None
    error_samples: list[str] = field(default_factory=list)


def base_url(url: str) -> str:
    """"http://host:8000/v1/" -> "http://host:8000"."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SpecdecError(f"--url must start with http:// or https://, got {url!r}")
    return url.removesuffix("/v1")


def request_body(endpoint: Endpoint, prompt: str | list[dict], spec: LoadSpec) -> dict:
    body = {"model": endpoint.model, "max_tokens": spec.max_tokens, "temperature": spec.temperature,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if endpoint.api == "chat":
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    else:
        if not isinstance(prompt, str):
            raise SpecdecError("the completions API takes text prompts; use --api chat for messages")
        body["prompt"] = prompt
    return {**body, **endpoint.extra_body}


def _chunk_text(obj: dict) -> str:
    text = ""
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


async def send(client, endpoint: Endpoint, body: dict, record: RequestRecord, clock) -> RequestRecord:
    """One streamed request; fills `record` (times from `clock()`), never raises for the
    server's or the network's failures."""
    import httpx

    counted = 0  # tokens attributed to chunks so far
    usage_total = None
    done = False
    try:
        async with client.stream("POST", endpoint.path, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                record.error = f"HTTP {r.status_code}: {_short(text)}"
                return record
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = clock()
                obj = json.loads(data)
                if "error" in obj:
                    record.error = f"error in stream: {_short(json.dumps(obj['error']))}"
                    return record
                text = _chunk_text(obj)
                usage = obj.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    usage_total = int(usage["completion_tokens"])
                    k = usage_total - counted
                else:
                    k = 1 if text else 0
                if k > 0:
                    counted += k
                    record.events.append((now, k))
        if not done:
            record.error = "the stream ended without [DONE]"
            return record
    except httpx.TimeoutException:
        record.error = f"timed out after {client.timeout.read:g} s"
        return record
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        record.error = f"{type(e).__name__}: {_short(str(e))}"
        return record
    finally:
        record.end = clock()
    record.tokens = usage_total if usage_total is not None else counted
    record.ok = True
    return record


async def run_level_async(endpoint: Endpoint, prompts: list, spec: LoadSpec, concurrency: int,
                          num_requests: int) -> tuple[list[RequestRecord], float]:
    """`num_requests` requests (prompt j % len(prompts) for request j) from `concurrency`
    clients, each sending its next request when the last one ends; (records, wall seconds)."""
    import httpx

    bodies = [request_body(endpoint, p, spec) for p in prompts]  # bad prompts fail before any request
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    records: list[RequestRecord | None] = [None] * num_requests
    next_index = iter(range(num_requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(spec.timeout, connect=30.0)

    async def client_loop(client):
        for j in next_index:  # shared: each request is taken by exactly one client
            p = j % len(prompts)
            records[j] = await send(client, endpoint, bodies[p], RequestRecord(p, start=clock()), clock)

    async with httpx.AsyncClient(base_url=endpoint.base, headers=endpoint.headers, timeout=timeout,
                                 limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return records, clock()


def run_level(endpoint: Endpoint, prompts: list, spec: LoadSpec, concurrency: int, num_requests: int,
              target: str = "") -> tuple[LevelReport, list[RequestRecord]]:
    """One concurrency level, measured: its report and the raw records."""
    if concurrency < 1:
        raise SpecdecError(f"concurrency must be >= 1, got {concurrency}")
    if num_requests < 1:
        raise SpecdecError(f"the number of requests must be >= 1, got {num_requests}")
    if not prompts:
        raise SpecdecError("no prompts to send")
    records, wall = asyncio.run(run_level_async(endpoint, prompts, spec, concurrency, num_requests))
    return summarize(target or endpoint.base, concurrency, records, wall), records


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


def summarize(target: str, concurrency: int, records: list[RequestRecord], wall: float) -> LevelReport:
    ok = [r for r in records if r.ok]
    errors = [r for r in records if not r.ok]
    tokens = sum(r.tokens for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl()]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    chunks = sum(len(r.events) for r in ok)
    samples = []
    for r in errors:
        if r.error not in samples and len(samples) < MAX_ERROR_SAMPLES:
            samples.append(r.error)
    return LevelReport(target, concurrency, len(records), len(ok), len(errors), tokens, wall,
                       tokens / wall if wall > 0 else 0.0, len(ok) / wall if wall > 0 else 0.0,
                       _pct(ttft, 50), _pct(ttft, 99), _pct(itl, 50), _pct(itl, 99), _pct(tpot, 50), _pct(tpot, 99),
                       sum(r.tokens for r in ok) / chunks if chunks else None, samples)


def served_model(url: str, api_key: str | None = None, timeout: float = 30.0) -> str:
    """The first model id the server lists on /v1/models (what --model defaults to)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base_url(url)}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise SpecdecError(f"cannot reach {base_url(url)}: {e}") from None
    if r.status_code != 200:
        raise SpecdecError(f"GET {base_url(url)}/v1/models answered {r.status_code}: {_short(r.text)}")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise SpecdecError(f"{base_url(url)}/v1/models lists no model; pass --model") from None
