"""Prometheus metrics, one CollectorRegistry per app (so tests can build several apps).

Exposed names (prometheus-client adds `_total` to counters itself):
  specdec:http_requests_total{endpoint,method,status}   requests answered
  specdec:http_request_duration_seconds{endpoint}       latency histogram (whole response)
  specdec:prompt_tokens_total                           prompt tokens of started requests
  specdec:generation_tokens_total                       tokens generated (cancelled ones included)
  specdec:request_success_total{finished_reason}        choices finished ("stop" / "length")
  specdec:requests_cancelled_total                      requests dropped by their client
  specdec:num_requests_running                          requests the engine is working on
  specdec:num_requests_waiting                          requests queued for the engine
  specdec:batch_size                                    sequences per batched step (--max-batch > 1)
  specdec:batch_slots_used                              sequences holding a slot of the batch now
                                                        (--max-batch > 1; 0 when idle: no leaked slot)
  specdec:request_queue_time_seconds                    time from submission until the engine takes
                                                        the request (histogram; dropped ones excluded)
  specdec:request_accepted_length                       per finished choice of a speculative server:
                                                        tokens per target pass (histogram; 1 = no
                                                        draft kept)
Speculative decoding, named like vLLM's, from finished choices:
  specdec:spec_decode_num_drafts_total                  decode steps that drafted >= 1 token
  specdec:spec_decode_num_draft_tokens_total            drafted tokens
  specdec:spec_decode_num_accepted_tokens_total         accepted drafted tokens
  specdec:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
                                                        steps whose draft at 0-based position i
                                                        was accepted
  specdec:replica_info{replica}                         1, on a replica of `serve --ray`: which replica's
                                                        registry this is

On a replica of `serve --ray` (`peers` given), /metrics is the whole deployment's: every replica's
samples with a `replica` label, this one's fresh and the others' as they last shared them (Ray
Serve's proxy sends a scrape to any one replica; ray_serve.py shares them)."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
ACCEPTED_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def accepted_per_position(histogram: list[int]) -> list[int]:
    """accepted_length_histogram[a] = steps that kept a drafts -> steps that accepted the draft at
    position i (a step keeping a drafts accepted positions 0..a-1)."""
    out = []
    for pos in range(len(histogram) - 1):
        out.append(sum(histogram[pos + 1:]))
    return out


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_positions: int = 0, replica_id: str | None = None,
                 peers: Callable[[], dict[str, str]] | None = None):
        r = self.registry = CollectorRegistry()
        self.replica_id = replica_id
        self.peers = peers  # the other replicas' latest exposition texts, by replica id
        if replica_id is not None:
            Gauge("specdec:replica_info", "The replica whose metrics these are (serve --ray)", ["replica"],
                  registry=r).labels(replica=replica_id).set(1)
        self.http_requests = Counter("specdec:http_requests", "HTTP requests answered",
                                     ["endpoint", "method", "status"], registry=r)
        self.http_latency = Histogram("specdec:http_request_duration_seconds",
                                      "Time from request to the end of the response",
                                      ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("specdec:prompt_tokens", "Prompt tokens of started requests",
                                     registry=r)
        self.generation_tokens = Counter("specdec:generation_tokens", "Generated tokens", registry=r)
        self.request_success = Counter("specdec:request_success", "Finished choices by finish reason",
                                       ["finished_reason"], registry=r)
        self.requests_cancelled = Counter("specdec:requests_cancelled",
                                          "Requests cancelled because the client went away", registry=r)
        self.num_requests_running = Gauge("specdec:num_requests_running",
                                          "Requests the engine is generating for", registry=r)
        self.num_requests_waiting = Gauge("specdec:num_requests_waiting",
                                          "Requests waiting in the queue", registry=r)
        self.batch_size = Histogram("specdec:batch_size", "Sequences in each batched decode step",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_slots_used = Gauge("specdec:batch_slots_used", "Sequences holding a slot of the batch",
                                      registry=r)
        self.queue_time = Histogram("specdec:request_queue_time_seconds",
                                    "Time a request waited in the queue before the engine took it",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.accepted_length = Histogram("specdec:request_accepted_length",
                                         "Tokens per target pass of each finished choice (speculative methods)",
                                         buckets=ACCEPTED_LENGTH_BUCKETS, registry=r)
        self.num_drafts = Counter("specdec:spec_decode_num_drafts",
                                  "Decode steps that drafted at least one token", registry=r)
        self.num_draft_tokens = Counter("specdec:spec_decode_num_draft_tokens", "Drafted tokens",
                                        registry=r)
        self.num_accepted_tokens = Counter("specdec:spec_decode_num_accepted_tokens",
                                           "Accepted drafted tokens", registry=r)
        self.num_accepted_tokens_per_pos = Counter(
            "specdec:spec_decode_num_accepted_tokens_per_pos",
            "Accepted drafted tokens by 0-based draft position", ["position"], registry=r)
        for reason in ("stop", "length"):
            self.request_success.labels(finished_reason=reason)
        for pos in range(max_positions):
            self.num_accepted_tokens_per_pos.labels(position=str(pos))

    def record_generation(self, result) -> None:
        """Count one finished choice (called from the worker thread)."""
        stats = result.stats
        self.request_success.labels(finished_reason=result.finish_reason).inc()
        if stats.speculative and stats.target_forwards:
            self.accepted_length.observe(stats.mean_accepted_length)
        drafts = sum(1 for k in stats.draft_tokens_per_step if k > 0)
        if drafts:
            self.num_drafts.inc(drafts)
        if stats.drafted_tokens:
            self.num_draft_tokens.inc(stats.drafted_tokens)
        if stats.accepted_tokens:
            self.num_accepted_tokens.inc(stats.accepted_tokens)
        for pos, count in enumerate(accepted_per_position(stats.accepted_length_histogram)):
            if count:
                self.num_accepted_tokens_per_pos.labels(position=str(pos)).inc(count)

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(endpoint=endpoint, method=method, status=str(status)).inc()
        self.http_latency.labels(endpoint=endpoint).observe(seconds)

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        if self.peers is None:
            return own
        texts = {replica: text for replica, text in self.peers().items() if replica != self.replica_id}
        texts[self.replica_id] = own.decode()
        return labeled_by_replica(texts)


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def labeled_by_replica(texts: dict[str, str]) -> bytes:
    """Several registries' exposition texts as one, each sample labeled with its replica."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, "replica": replica}, sample.value, sample.timestamp)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
