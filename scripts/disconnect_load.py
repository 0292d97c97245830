"""Random client disconnects under load (issue #16): starts `specdec serve`, sends a storm of
streaming requests from concurrent clients, a random part of which hang up at a random point,
and checks what must hold afterwards:
- no slot leak: /metrics shows running and waiting back to 0 and no sequence in the batch
  (`specdec:batch_slots_used`), and the server's RSS after the storm is within a margin of its
  RSS after a warm-up storm of the same shape (allocator and caches settle in the warm-up);
- the next request is answered promptly (total latency under --max-latency seconds);
- nothing mixed: every completed greedy or seeded response equals the same request sent alone
  afterwards (one request at a time: a batch of one).

Disconnect kinds: `sent` (the request is written, then the socket closed before any answer),
`headers` (closed once the response headers arrive, before the first token), `mid` (closed
after a random number of chunks). Why raw sockets for `sent`: an HTTP client cannot stop
between sending and reading.

    python scripts/disconnect_load.py [--requests 200 --concurrency 16] [-- SERVE ARGS...]

SERVE ARGS replace the defaults (`--method ngram --max-batch 8 --threads 1`); the report goes
to --out (text) and the same path with .json."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

DEFAULT_SERVE = ["--method", "ngram", "--max-batch", "8", "--threads", "1"]
KINDS = ("sent", "headers", "mid")


@dataclass
class Plan:
    """One request of the storm: its body and how (or whether) its client hangs up."""
    body: dict
    drop: str | None  # None: read to the end; else one of KINDS
    after_chunks: int = 0  # for "mid": chunks read before hanging up


@dataclass
class Outcome:
    plan: Plan
    texts: list[str] | None = None  # each choice's whole text when read to the end
    finish: str | None = None
    status: int | None = None
    error: str | None = None


def prompts(count: int) -> list[str]:
    from specdec.data.prompts import build_suite

    return [p.text for p in build_suite(count, ["code", "edit", "freetext"])]


def make_plans(n: int, texts: list[str], rng: random.Random, drop_fraction: float, max_tokens: tuple[int, int],
               model: str) -> list[Plan]:
    """Mixed greedy and seeded sampled requests, mixed lengths, a random part dropped."""
    plans = []
    for _ in range(n):
        body = {"model": model, "prompt": rng.choice(texts), "max_tokens": rng.randint(*max_tokens),
                "stream": True, "temperature": 0}
        if rng.random() < 0.5:
            body.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(1 << 30))
        if rng.random() < 0.25:
            body["ignore_eos"] = True
        if rng.random() < 0.1:  # two choices: both leave the batch when the client does
            body["n"] = 2
        drop = rng.choice(KINDS) if rng.random() < drop_fraction else None
        plans.append(Plan(body, drop, rng.randint(1, 12) if drop == "mid" else 0))
    return plans


async def send_and_close(port: int, body: dict) -> None:
    """Write the whole request on a raw socket and close it without reading."""
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + payload)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def stream_one(url: str, plan: Plan) -> Outcome:
    """One streamed request on its own connection, read to the end or dropped as planned."""
    out = Outcome(plan)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async with client.stream("POST", "/v1/completions", json=plan.body) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.error = (await r.aread()).decode(errors="replace")[:200]
                return out
            if plan.drop == "headers":
                return out  # leaving the block closes the connection before the first token
            parts, chunks = [""] * plan.body.get("n", 1), 0
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    out.error = json.dumps(obj["error"])[:200]
                    continue
                for choice in obj.get("choices", []):
                    parts[choice["index"]] += choice["text"]
                    out.finish = choice.get("finish_reason") or out.finish
                chunks += 1
                if plan.drop == "mid" and chunks >= plan.after_chunks:
                    return out
            out.texts = parts
    return out


async def storm(url: str, port: int, plans: list[Plan], concurrency: int) -> list[Outcome]:
    """Every plan, at most `concurrency` at once."""
    gate = asyncio.Semaphore(concurrency)

    async def run(plan: Plan) -> Outcome:
        async with gate:
            try:
                if plan.drop == "sent":
                    await send_and_close(port, plan.body)
                    return Outcome(plan)
                return await stream_one(url, plan)
            except Exception as e:  # noqa: BLE001 - a client error is counted, not fatal
                return Outcome(plan, error=f"{type(e).__name__}: {e}")

    return await asyncio.gather(*(run(p) for p in plans))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(url: str, timeout: float) -> tuple[dict[str, float], float]:
    """The metrics once running and waiting are 0 (or at the timeout), and the seconds it took."""
    t0 = time.monotonic()
    while True:
        m = metrics(url)
        idle = m["specdec:num_requests_running"] == 0 and m["specdec:num_requests_waiting"] == 0
        if idle or time.monotonic() - t0 > timeout:
            return m, time.monotonic() - t0
        time.sleep(0.05)


def fresh_request(url: str, model: str, prompt: str) -> dict:
    """A request right after the storm: its total and first-token latency."""
    body = {"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = None
    with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
        status = r.status_code
    return {"status": status, "seconds": time.perf_counter() - t0, "first_token_seconds": first}


def replay(url: str, outcomes: list[Outcome]) -> list[dict]:
    """Each completed response against the same request sent alone: the mismatches."""
    bad = []
    for o in outcomes:
        if o.texts is None:
            continue
        alone = asyncio.run(stream_one(url, Plan(o.plan.body, None)))
        if alone.texts != o.texts:
            bad.append({"body": {k: v for k, v in o.plan.body.items() if k != "prompt"},
                        "storm": [t[:80] for t in o.texts], "alone": alone.texts or alone.error})
    return bad


def summarize(outcomes: list[Outcome]) -> dict:
    planned = {k: sum(1 for o in outcomes if o.plan.drop == k) for k in KINDS}
    return {"requests": len(outcomes), "dropped": planned,
            "completed": sum(1 for o in outcomes if o.texts is not None),
            "two_choices": sum(1 for o in outcomes if "n" in o.plan.body),
            "completed_before_mid_drop": sum(1 for o in outcomes if o.plan.drop == "mid" and o.finish),
            "client_errors": [o.error for o in outcomes if o.error][:10],
            "client_error_count": sum(1 for o in outcomes if o.error),
            "seeded": sum(1 for o in outcomes if "seed" in o.plan.body)}


def timed_storm(args, url: str, port: int, plans: list[Plan]) -> tuple[dict, list[Outcome]]:
    """A storm's summary (with its seconds) and outcomes."""
    t0 = time.perf_counter()
    outcomes = asyncio.run(storm(url, port, plans, args.concurrency))
    return {**summarize(outcomes), "seconds": round(time.perf_counter() - t0, 1)}, outcomes


def run(args, serve_args: list[str]) -> dict:
    from specdec.bench.servers import SpecdecServer

    with SpecdecServer(serve_args, startup_seconds=120) as server:
        return measure(args, serve_args, server.url, server.port, server.process.pid)


def measure(args, serve_args: list[str], url: str, port: int, pid: int) -> dict:
    """The two storms and every check against a started server (its process id for VmRSS)."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    texts = prompts(args.prompts)
    rng = random.Random(args.seed)
    report: dict = {"serve_args": serve_args, "concurrency": args.concurrency, "seed": args.seed}
    report["rss_mib_start"] = rss_mib(pid)
    report["warmup"] = timed_storm(args, url, port, make_plans(args.requests, texts, rng, args.drop_fraction,
                                                               (args.min_tokens, args.max_tokens), model))[0]
    report["warmup_idle_seconds"] = round(wait_idle(url, 30)[1], 2)
    report["rss_mib_after_warmup"] = rss_mib(pid)
    report["storm"], outcomes = timed_storm(args, url, port, make_plans(
        args.requests, texts, rng, args.drop_fraction, (args.min_tokens, args.max_tokens), model))
    report["next_request"] = fresh_request(url, model, texts[0])
    m, idle = wait_idle(url, 30)
    report["idle_seconds"] = round(idle, 2)
    report["metrics_after"] = {k: m.get(k) for k in (
        "specdec:num_requests_running", "specdec:num_requests_waiting", "specdec:batch_slots_used",
        "specdec:requests_cancelled_total", "specdec:generation_tokens_total")}
    report["rss_mib_after_storm"] = rss_mib(pid)
    report["mismatches"] = replay(url, outcomes)
    report["rss_mib_after_replay"] = rss_mib(pid)
    return report


def verdicts(report: dict, args) -> dict[str, bool]:
    m = report["metrics_after"]
    growth = report["rss_mib_after_storm"] - report["rss_mib_after_warmup"]
    margin = max(args.rss_margin_mib, 0.05 * report["rss_mib_after_warmup"])
    report["rss_growth_mib"], report["rss_margin_mib"] = round(growth, 1), round(margin, 1)
    return {"gauges_zero": m["specdec:num_requests_running"] == 0 and m["specdec:num_requests_waiting"] == 0
            and m.get("specdec:batch_slots_used") == 0,
            "memory_flat": growth <= margin,
            "next_request_fast": report["next_request"]["status"] == 200
            and report["next_request"]["seconds"] < args.max_latency,
            "nothing_mixed": not report["mismatches"] and report["storm"]["completed"] > 0,
            "no_client_errors": report["storm"]["client_error_count"] == 0}


def text_report(report: dict, ok: dict[str, bool]) -> str:
    s, n = report["storm"], report["next_request"]
    equal = s["completed"] - len(report["mismatches"])
    lines = [
        f"specdec serve {' '.join(report['serve_args'])}: {s['requests']} streamed requests from "
        f"{report['concurrency']} clients in {s['seconds']} s ({s['seeded']} seeded, the rest greedy; "
        f"{s['two_choices']} with n=2)",
        f"dropped: {s['dropped']} (sent = closed right after sending, headers = before the first token, "
        f"mid = after 1-12 chunks); completed {s['completed']}; client errors {s['client_error_count']}",
        f"after the storm: running {report['metrics_after']['specdec:num_requests_running']:.0f}, waiting "
        f"{report['metrics_after']['specdec:num_requests_waiting']:.0f}, slots used "
        f"{report['metrics_after'].get('specdec:batch_slots_used')} (idle after {report['idle_seconds']} s)",
        f"RSS MiB: start {report['rss_mib_start']:.1f}, after warm-up storm {report['rss_mib_after_warmup']:.1f}, "
        f"after storm {report['rss_mib_after_storm']:.1f} (growth {report['rss_growth_mib']} MiB, margin "
        f"{report['rss_margin_mib']}), after replay {report['rss_mib_after_replay']:.1f}",
        f"next request: {n['seconds']:.2f} s (first token {n['first_token_seconds'] or 0:.2f} s), status {n['status']}",
        f"completed responses equal to the request alone: {equal}/{s['completed']}",
        "checks: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in ok.items()),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    argv = sys.argv[1:]
    serve_args = DEFAULT_SERVE
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--drop-fraction", type=float, default=0.5)
    p.add_argument("--min-tokens", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4, help="prompts per task (code, edit, freetext)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-latency", type=float, default=2.0)
    p.add_argument("--rss-margin-mib", type=float, default=16.0, help="allowed growth (or 5%% of RSS if more)")
    p.add_argument("--out", default="bench/results/disconnects.txt")
    args = p.parse_args(argv)
    report = run(args, serve_args)
    ok = verdicts(report, args)
    report["checks"] = ok
    text = text_report(report, ok)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(text, end="")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
