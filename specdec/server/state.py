"""What the route handlers share: the settings and the per-app objects built from one decoder.
create_app builds one ServerState and keeps it on app.state.server."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec.chat.template import ChatTemplate
from specdec.engine.decoder import SpecDecoder
from specdec.server.metrics import Metrics
from specdec.server.validation import RequestParser
from specdec.server.worker import EngineWorker

MAX_BODY_BYTES = 1 << 20  # 1 MiB


@dataclass
class ServerSettings:
    model_name: str | None = None  # default: the target folder's name
    api_key: str | None = None  # None: no authentication
    max_queue: int = 64  # requests waiting for the engine; more -> 429
    max_tokens_limit: int | None = 4096  # largest max_tokens accepted (None: the context window)
    max_body_bytes: int = MAX_BODY_BYTES
    max_batch: int = 1  # > 1: continuous batching of up to this many sequences (Scheduler)
    engine_thread: bool = True  # False: the caller runs the engine loop (EngineWorker.run_here)
    replica_id: str | None = None  # one of several replicas (Ray Serve): sent as X-Specdec-Replica
    peer_metrics: Callable[[], dict[str, str]] | None = None  # the other replicas' /metrics texts, by id


@dataclass
class ServerState:
    decoder: SpecDecoder
    settings: ServerSettings
    served_name: str
    metrics: Metrics
    worker: EngineWorker
    parser: RequestParser
    started_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def build(cls, decoder: SpecDecoder, settings: ServerSettings) -> ServerState:
        served_name = settings.model_name or decoder.target_path.name
        metrics = Metrics(max_positions=decoder.max_draft_tokens, replica_id=settings.replica_id,
                          peers=settings.peer_metrics)
        worker = EngineWorker(decoder, settings.max_queue, metrics, settings.max_batch, settings.engine_thread)
        parser = RequestParser(decoder, served_name, settings.max_tokens_limit,
                               ChatTemplate.from_tokenizer_config(decoder.tokenizer.config))
        return cls(decoder, settings, served_name, metrics, worker, parser)
