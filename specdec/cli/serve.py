"""`specdec serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

The web packages are imported only when the command runs, so the rest of the CLI works
without them."""
from __future__ import annotations

import os
import signal
import sys
import threading

from specdec.cli.common import (
    add_model_args,
    add_threads_arg,
    apply_threads,
    check_at_least,
    decoder_config,
    load_decoder,
)
from specdec.errors import SpecdecError
from specdec.extras import require

API_KEY_ENV = "SPECDEC_API_KEY"


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (/v1/completions, "
                                     "/v1/chat/completions, /v1/responses, /v1/models, /health, /metrics)")
    add_model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    s.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health "
                        f"(default: ${API_KEY_ENV} if set, else no key)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for the engine; beyond that the server answers 429")
    s.add_argument("--max-batch", type=int, default=1,
                   help="sequences decoded together (continuous batching; methods none, ngram, draft); "
                        "1 = one generation at a time (default)")
    s.add_argument("--max-len", type=int, default=None,
                   help="longest context (prompt + completion) a request may use; bounds the KV cache, "
                        "which --max-batch multiplies (default: the model's window)")
    s.add_argument("--max-tokens-limit", type=int, default=4096,
                   help="largest max_tokens a request may ask for (default 4096)")
    s.add_argument("--model-name", default=None,
                   help="model id clients use (default: the target folder's name)")
    add_threads_arg(s)
    r = s.add_argument_group("scale-out on Ray Serve (the `ray` extra)")
    r.add_argument("--ray", action="store_true",
                   help="serve the same API from several replicas on a Ray cluster, each loading the model and "
                        "running its own engine with --threads threads (default 1); Ray's proxy listens on "
                        "--host/--port and spreads requests over the replicas")
    r.add_argument("--replicas", type=int, default=None, help="--ray: how many replicas (default 1)")
    r.add_argument("--autoscale", default=None, metavar="MIN,MAX",
                   help="--ray: between MIN and MAX replicas, one more when the replicas hold more requests "
                        "than their batches (--max-batch) take")
    r.add_argument("--ray-address", default=None,
                   help="--ray: the cluster to deploy on (ray://HEAD:10001, or 'auto' for a cluster started "
                        "with `ray start` on this machine; default $RAY_ADDRESS, else a local one started here)")
    r.add_argument("--drain-timeout", type=float, default=120.0,
                   help="--ray: seconds a replica leaving (scale-down, stop) may take to finish its requests "
                        "(default 120)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=cmd_serve)


def check_args(args) -> None:
    if not 0 <= args.port <= 65535:
        raise SpecdecError(f"--port must be in [0, 65535], got {args.port}")
    check_at_least(args.max_queue, "--max-queue", 1)
    check_at_least(args.max_batch, "--max-batch", 1)
    if args.compile and args.max_batch > 1:
        raise SpecdecError("--compile speeds single-sequence passes; --max-batch > 1 runs batched passes, "
                           "which are not compiled: use one or the other")
    if args.max_len is not None:
        check_at_least(args.max_len, "--max-len", 2)
    check_at_least(args.max_tokens_limit, "--max-tokens-limit", 1)
    if args.model_name is not None and not args.model_name.strip():
        raise SpecdecError("--model-name must not be empty")
    if args.api_key is not None and not args.api_key:
        raise SpecdecError("--api-key must not be empty")
    if not args.ray:
        for flag, value in (("--replicas", args.replicas), ("--autoscale", args.autoscale),
                            ("--ray-address", args.ray_address)):
            if value is not None:
                raise SpecdecError(f"{flag} needs --ray")
        return
    if args.replicas is not None and args.autoscale is not None:
        raise SpecdecError("--replicas and --autoscale exclude each other: a fixed count or a range")
    if args.replicas is not None:
        check_at_least(args.replicas, "--replicas", 1)
    if args.compile:
        raise SpecdecError("--compile is not supported with --ray (each replica would compile for minutes)")
    if not args.drain_timeout > 0:
        raise SpecdecError(f"--drain-timeout must be > 0 seconds, got {args.drain_timeout}")


def ray_scaling(args):
    from specdec.server.ray_serve import Scaling, parse_autoscale

    low = high = None
    if args.autoscale is not None:
        low, high = parse_autoscale(args.autoscale)
    return Scaling(replicas=args.replicas or 1, min_replicas=low, max_replicas=high, threads=args.threads or 1,
                   drain_s=args.drain_timeout)


def cmd_serve(args) -> int:
    check_args(args)
    apply_threads(args)
    for module in ("fastapi", "uvicorn", "prometheus_client", "jinja2"):
        require(module, "server", "the server")
    from specdec.server.app import ServerSettings, create_app

    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    settings = ServerSettings(model_name=args.model_name, api_key=api_key, max_queue=args.max_queue,
                              max_tokens_limit=args.max_tokens_limit, max_batch=args.max_batch,
                              engine_thread=False)
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"specdec: warning: listening on {args.host} without an API key (--api-key)", file=sys.stderr)
    if args.ray:
        from specdec.server import ray_serve

        require("ray.serve", "ray", "specdec serve --ray")
        return ray_serve.run(decoder_config(args, max_len=args.max_len), settings, ray_scaling(args), args.host,
                             args.port, address=args.ray_address)
    import uvicorn

    decoder = load_decoder(args, max_len=args.max_len)
    app = create_app(decoder, settings)
    print(f"specdec: serving {app.state.served_name!r} (method={decoder.method}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    return serve_in_main_thread(app, uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))


def serve_in_main_thread(app, config) -> int:
    """The HTTP server in a second thread, the engine loop in this (the main) thread, where
    PyTorch's parallel ops run at full speed (EngineWorker.run_here). Ctrl-C or SIGTERM stop
    the HTTP server, whose shutdown stops the engine loop; so does the server failing to start
    (exit status 1)."""
    import uvicorn

    server = uvicorn.Server(config)
    worker = app.state.server.worker

    def serve_http() -> None:
        try:
            server.run()
        finally:
            worker.stop()

    http = threading.Thread(target=serve_http, name="specdec-http", daemon=True)
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: setattr(server, "should_exit", True)) for sig in signals}
    http.start()
    try:
        worker.run_here()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        http.join(timeout=15)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1
