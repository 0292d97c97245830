"""`specdec serve --ray`: the same OpenAI-compatible app on several Ray Serve replicas.

Each replica is a Ray actor that loads the model itself (from the same DecoderConfig) and runs
create_app's FastAPI app with its own engine thread; Ray's HTTP proxy spreads requests over the
replicas by their queue lengths (no prefix affinity). Health: Ray calls each
replica's check_health, which fails once its engine worker has stopped; Ray then replaces it.
Scale-down drains: a replica leaving gets no new requests and is stopped only when its
in-flight requests (streams included) have finished, or after `drain_s`. Metrics: each replica
sends its registry's text to a detached MetricsBoard actor every METRICS_PERIOD_S and keeps the
others', so a scrape that Ray's proxy gives to any one replica returns every replica's samples,
labeled by replica (server/metrics.py).

Ray is imported only here, and only when these functions run (the `ray` extra)."""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from specdec.engine.config import DecoderConfig
from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.server.state import ServerSettings

log = logging.getLogger("specdec.server")

APP_NAME = "specdec"
METRICS_BOARD = "specdec-metrics-board"
METRICS_NAMESPACE = "specdec"
METRICS_PERIOD_S = 2.0
HEALTH_CHECK_PERIOD_S = 5.0
HEALTH_CHECK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Scaling:
    """A fixed number of replicas, or autoscaling between min_replicas and max_replicas on the
    requests each replica holds (target: its batch full)."""
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    threads: int = 1  # CPU threads per replica (Ray reserves that many CPUs for each)
    drain_s: float = 120.0  # how long a replica leaving may take to finish its requests

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN,MAX' -> (MIN, MAX), with 0 <= MIN <= MAX and MAX >= 1."""
    parts = text.split(",")
    try:
        low, high = (int(p) for p in parts)
    except ValueError:
        raise SpecdecError(f"--autoscale takes MIN,MAX (two integers, e.g. 1,4), got {text!r}") from None
    if low < 0 or high < 1 or low > high:
        raise SpecdecError(f"--autoscale MIN,MAX needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return low, high


def deployment_options(scaling: Scaling, settings: ServerSettings) -> dict:
    """ray.serve.deployment's options for these replicas."""
    options = dict(
        ray_actor_options={"num_cpus": scaling.threads},
        # a replica takes what its own server admits (running + queued); beyond that it answers
        # 429 itself, as one server does
        max_ongoing_requests=settings.max_batch + settings.max_queue,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_wait_loop_s=1.0,
        graceful_shutdown_timeout_s=scaling.drain_s,
    )
    if scaling.autoscaled:
        options["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "initial_replicas": max(scaling.min_replicas, 1),
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": settings.max_batch,  # a replica is busy when its batch is full
        }
    else:
        options["num_replicas"] = scaling.replicas
    return options


class MetricsBoard:
    """A Ray actor: every replica's latest /metrics text, so that any replica can answer a scrape
    for all of them. A replica silent for 3 periods (gone) is dropped."""

    def __init__(self):
        self.texts: dict[str, tuple[float, str]] = {}

    def put(self, replica_id: str, text: str) -> dict[str, str]:
        """Store one replica's text; return every live replica's."""
        now = time.monotonic()
        self.texts[replica_id] = (now, text)
        self.texts = {r: (t, x) for r, (t, x) in self.texts.items() if now - t < 3 * METRICS_PERIOD_S}
        return {r: x for r, (_, x) in self.texts.items()}


class MetricsShare:
    """In a replica: a daemon thread that sends this replica's metrics to the board every period
    and keeps the others' from its answer, for Metrics.render (no Ray call on a scrape)."""

    def __init__(self, replica_id: str):
        self.replica_id = replica_id
        self.latest: dict[str, str] = {}

    def peers(self) -> dict[str, str]:
        return self.latest

    def start(self, registry) -> None:
        import ray
        from prometheus_client import generate_latest

        def board():  # the one board of the cluster, created by whichever replica asks first
            return ray.remote(MetricsBoard).options(name=METRICS_BOARD, namespace=METRICS_NAMESPACE,
                                                    get_if_exists=True, lifetime="detached", num_cpus=0).remote()

        def share() -> None:
            handle = None
            while True:
                try:
                    handle = handle or board()
                    self.latest = ray.get(handle.put.remote(self.replica_id, generate_latest(registry).decode()),
                                          timeout=METRICS_PERIOD_S)
                except Exception as e:  # a board gone: ask again next time; this replica's own metrics still answer
                    log.warning("could not share this replica's metrics: %s", e)
                    handle = None
                time.sleep(METRICS_PERIOD_S)

        threading.Thread(target=share, name="specdec-metrics-share", daemon=True).start()


def build_application(config: DecoderConfig, settings: ServerSettings, scaling: Scaling):
    """The Ray Serve application (not yet running): serve.run(...) deploys it."""
    serve = require("ray.serve", "ray", "specdec serve --ray")
    threads = scaling.threads

    def build_replica_app():
        """Runs in each replica's process: load the model, build the app, named after the replica."""
        import torch

        from specdec.engine.decoder import load_config
        from specdec.server.app import create_app

        torch.set_num_threads(threads)
        replica_id = serve.get_replica_context().replica_id.unique_id
        board = MetricsShare(replica_id)
        app = create_app(load_config(config), replace(settings, replica_id=replica_id, engine_thread=True,
                                                       peer_metrics=board.peers))
        board.start(app.state.server.metrics.registry)
        return app

    class SpecdecReplica:
        def check_health(self) -> None:
            if not self.app.state.server.worker.alive:
                raise RuntimeError("the engine worker is not running")

    replica = serve.ingress(build_replica_app)(SpecdecReplica)
    return serve.deployment(replica, name="SpecdecReplica", **deployment_options(scaling, settings)).bind()


def replica_error(serve) -> str | None:
    """The last line of the failed deployment's message (a replica's exception), if there is one."""
    status = serve.status().applications.get(APP_NAME)
    for deployment in status.deployments.values() if status else ():
        lines = [line for line in (deployment.message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1].removeprefix("specdec.errors.SpecdecError: ")
    return None


def remove_metrics_board(ray) -> None:
    """The board is detached (it outlives any one replica): remove it with the application."""
    try:
        ray.kill(ray.get_actor(METRICS_BOARD, namespace=METRICS_NAMESPACE))
    except ValueError:  # never created
        pass


def run(config: DecoderConfig, settings: ServerSettings, scaling: Scaling, host: str, port: int,
        address: str | None = None) -> int:
    """Deploy on the Ray cluster at `address` (None: $RAY_ADDRESS, else a local cluster started
    here), serve on host:port until Ctrl-C or SIGTERM, then delete the application (its replicas
    drain)."""
    ray = require("ray", "ray", "specdec serve --ray")
    serve = require("ray.serve", "ray", "specdec serve --ray")
    # Ctrl-C reaches the whole process group: the Ray processes started here ignore it (an ignored
    # signal stays ignored across fork and exec), so that this process alone stops and they drain
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ray.init(address=address, log_to_driver=False)
    finally:
        signal.signal(signal.SIGINT, interrupt)
    # from here on Ctrl-C / SIGTERM mean "stop once deployed": one arriving while the replicas still
    # load (a client may already be answered by one) must not cut the deployment short
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            serve.start(http_options={"host": host, "port": port})
            try:
                serve.run(build_application(config, settings, scaling), name=APP_NAME, route_prefix="/")
            except RuntimeError as e:
                raise SpecdecError(f"the replicas did not start: {replica_error(serve) or e}") from None
            count = (f"{scaling.min_replicas}-{scaling.max_replicas} replicas (autoscaled)" if scaling.autoscaled
                     else f"{scaling.replicas} replica{'s' * (scaling.replicas != 1)}")
            print(f"specdec: serving on Ray Serve, {count} x {scaling.threads} thread(s), on "
                  f"http://{host}:{port}/v1", file=sys.stderr)
            while not stop.wait(1.0):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        print("specdec: stopping: the replicas finish their requests first (Ctrl-C again: at once)", file=sys.stderr)
        serve.delete(APP_NAME)
        remove_metrics_board(ray)
    finally:
        ray.shutdown()
    return 0
