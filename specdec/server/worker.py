"""The one engine worker: the only thread that touches the model.

The model (and its KV cache) is not thread-safe, so exactly one thread owns the decoder: its
own thread (start(), as in-process test clients use it), or the caller's (run_here():
`specdec serve` runs the engine in the main thread and the HTTP server beside it, because
PyTorch's parallel CPU ops run 2-10x slower from a second thread here). Requests become Jobs in a bounded queue
(full -> the handler answers 429). The thread runs the decoder's one loop (a Scheduler of
`--max-batch N` slots; N = 1, the default, is the decoder's own runner and cache) and posts
events back to the job's asyncio queue with loop.call_soon_threadsafe, so the async handlers
never block the event loop. A job's choices take slots as they free; the next job leaves the
queue only when a slot is free and the previous job's choices all have one, so the queue
still fills and answers 429.

Cancellation: a handler that sees its client go away calls job.cancel(). The worker checks
the flag between decode steps: a cancelled job's sequences leave the batch before the next
step; a job cancelled while still queued is skipped without touching the model.

A job whose client left while it was still queued is dropped from the queue when a new job
finds it full (JobQueue.purge), and the waiting gauge counts only live jobs: abandoned jobs
must not answer 429 to live clients while the batch is busy."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

from specdec.engine.batch_drafting import BATCHED_METHODS
from specdec.engine.requests import stream_chunks
from specdec.errors import SpecdecError
from specdec.server.errors import ApiError
from specdec.server.jobs import Event, Job, JobQueue, QueueFull, RunningJob

log = logging.getLogger("specdec.server")


class EngineWorker:
    def __init__(self, decoder, max_queue: int, metrics, max_batch: int = 1, own_thread: bool = True):
        self.decoder = decoder
        self.own_thread = own_thread  # False: start() does nothing, the caller runs run_here()
        self._here = False
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        if max_batch > 1 and decoder.method not in BATCHED_METHODS:
            raise SpecdecError(f"--max-batch > 1 batches the methods {', '.join(BATCHED_METHODS)}; "
                               f"this server's method is {decoder.method!r}")
        self.batch = decoder.scheduler(max_batch)
        if self.batch.method != decoder.method:  # a drafter that cannot be forked per sequence
            raise SpecdecError(f"--max-batch > 1 cannot batch this server's {decoder.method!r} drafter")
        self._jobs: list[RunningJob] = []  # jobs in the batch, in arrival order
        self.queue = JobQueue(maxsize=max_queue)  # Job | None (None wakes the worker to stop)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        metrics.num_requests_waiting.set_function(self.queue.live)
        metrics.batch_slots_used.set_function(lambda: len(self.batch))

    # ---- lifecycle ----
    def start(self) -> None:
        with self._lock:
            if not self.own_thread or (self._thread is not None and self._thread.is_alive()):
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
            self._thread.start()

    def run_here(self) -> None:
        """The engine loop in the calling thread, until stop(): `specdec serve` runs it in the
        main thread and the HTTP server in a second one. PyTorch's OpenMP-parallel ops run
        2-10x slower when called from a thread other than the one that ran them first (the
        main thread, which loaded and calibrated the model). Measured here, SmolLM2 bf16:
        plain decoding 37 tok/s from a second thread vs 66 from the main thread; 16 sequences
        batched 90 vs 206 tok/s."""
        self._here = True
        try:
            self._run()
        finally:
            self._here = False

    @property
    def alive(self) -> bool:
        return self._here or (self._thread is not None and self._thread.is_alive())

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for running in list(self._jobs):
            running.job.cancel()
        while True:  # answer what is still queued
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(Event("error", error=ApiError(503, "the server is shutting down",
                                                        code="shutting_down")))
                job.post(Event("end"))
        try:
            self.queue.put_nowait(None)  # wake the worker
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        if self._stop.is_set():
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        job.queued_at = time.perf_counter()
        try:
            self.queue.put_nowait(job)
            return
        except queue.Full:
            pass
        self._drop_queued(self.queue.purge())
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def _drop_queued(self, jobs: list[Job]) -> None:
        """End jobs cancelled while queued (called from any thread: post is thread-safe)."""
        for job in jobs:
            self.metrics.requests_cancelled.inc()
            job.post(Event("end"))

    # ---- the thread ----
    def _accept(self, job: Job | None) -> bool:
        """Whether a job taken from the queue runs: a cancelled one is ended here, None (the
        stop signal) skipped; an admitted job's first choice starts now."""
        if job is None:
            return False
        if job.cancelled:
            self.metrics.requests_cancelled.inc()
            job.post(Event("end"))
            return False
        self._started(job)
        return True

    def _started(self, job: Job) -> None:
        """The engine takes a job from the queue (and its first choice starts now)."""
        self.metrics.queue_time.observe(time.perf_counter() - job.queued_at)
        self.metrics.num_requests_running.inc()
        self.metrics.prompt_tokens.inc(job.prompt_tokens)

    def _count(self, job: Job, index: int, chunk) -> int:
        """Count a chunk's tokens (metrics, and the choice's running total, which a finished
        choice takes from its result); returns that total."""
        if chunk.token_ids:
            self.metrics.generation_tokens.inc(len(chunk.token_ids))
        total = len(chunk.result.token_ids) if chunk.result is not None else job.generated[index] + len(chunk.token_ids)
        job.generated[index] = total
        return total

    def _run(self) -> None:
        while not self._stop.is_set() or self._jobs:
            try:
                self._drop_cancelled()
                self._admit(block=not self._jobs)
                if len(self.batch):
                    self.metrics.batch_size.observe(len(self.batch))
                    self._deliver(self.batch.step())
            except Exception as e:  # noqa: BLE001 - a bug must not kill the only worker
                if isinstance(e, SpecdecError):
                    error = ApiError(400, str(e))
                else:
                    log.exception("generation failed")
                    error = ApiError(500, "internal error during generation", code="internal_error")
                for running in list(self._jobs):
                    self._end(running, error)
                for entry in list(self.batch.entries):
                    self.batch.cancel(entry.seq)

    def _admit(self, block: bool) -> None:
        """Give free slots to waiting choices, taking the next job from the queue only when
        the jobs already admitted have all their choices in the batch."""
        while self.batch.free_slots:
            running = next((r for r in self._jobs if r.waiting), None)
            if running is None:
                if self._stop.is_set():
                    return
                try:
                    job = self.queue.get(timeout=0.5) if block and not self._jobs else self.queue.get_nowait()
                except queue.Empty:
                    return
                if not self._accept(job):
                    continue
                running = RunningJob(job, deque(enumerate(job.samplings)))
                self._jobs.append(running)
            index, sampling = running.waiting.popleft()
            try:
                seq = self.batch.add(running.job.prompts[index], sampling)
            except SpecdecError as e:
                self._end(running, ApiError(400, str(e)))
                continue
            running.running[id(seq)] = (seq, index)

    def _deliver(self, events) -> None:
        owners = {key: running for running in self._jobs for key in running.running}
        for event in events:
            running = owners.get(id(event.seq))
            if running is None:
                continue
            seq, index = running.running[id(event.seq)]
            job = running.job
            for chunk in stream_chunks(self.batch, event):
                generated = self._count(job, index, chunk)
                if chunk.result is not None:
                    self.metrics.record_generation(chunk.result)
                    job.post(Event("done", index, chunk.text, chunk.token_ids, chunk.result, generated=generated))
                    del running.running[id(seq)]
                elif job.stream and (chunk.text or chunk.token_logprobs or chunk.prompt_logprobs):
                    job.post(Event("chunk", index, chunk.text, chunk.token_ids, chunk=chunk, generated=generated))
            if not running.running and not running.waiting:
                self._end(running)

    def _drop_cancelled(self) -> None:
        for running in list(self._jobs):
            if running.job.cancelled:
                self.metrics.requests_cancelled.inc()
                self._end(running)

    def _end(self, running: RunningJob, error: ApiError | None = None) -> None:
        """The job is over (done, cancelled or failed): its sequences leave the batch."""
        for seq, _ in running.running.values():
            self.batch.cancel(seq)
        running.running.clear()
        running.waiting.clear()
        self._jobs.remove(running)
        self.metrics.num_requests_running.dec()
        if error is not None:
            running.job.post(Event("error", error=error))
        running.job.post(Event("end"))
