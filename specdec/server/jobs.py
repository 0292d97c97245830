"""What a request becomes for the engine worker (worker.py): a Job of one or more choices, the
Events it posts back to its handler's event loop, and the bounded JobQueue (full -> 429).

Cancellation: a handler that sees its client go away calls job.cancel(); the worker checks the
flag between decode steps. A job whose client left while still queued is dropped from the queue
when a new job finds it full (JobQueue.purge), and the waiting gauge counts only live jobs."""
from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from specdec.sampling import SamplingParams
from specdec.server.errors import ApiError


@dataclass
class Event:
    kind: str  # "chunk" (a text delta) | "done" (a choice finished) | "error" | "end" (job over)
    index: int = 0
    text: str = ""
    token_ids: list[int] | None = None
    result: Any = None  # GenerationResult on "done"
    chunk: Any = None  # the StreamChunk of a "chunk" event (its logprobs)
    error: ApiError | None = None
    generated: int = 0  # tokens this choice has generated so far (posted or not: continuous usage)


class Job:
    """One request's choices. prompt_ids: the prompt every choice continues, or with
    `prompts` (batched completions prompts) the first one; prompts[i]: choice i's prompt."""

    def __init__(self, prompt_ids: list[int], samplings: list[SamplingParams], stream: bool,
                 loop: asyncio.AbstractEventLoop, prompts: list[list[int]] | None = None,
                 prompt_tokens: int | None = None):
        self.prompt_ids = prompt_ids
        self.samplings = samplings
        self.prompts = prompts if prompts is not None else [prompt_ids] * len(samplings)
        self.prompt_tokens = prompt_tokens if prompt_tokens is not None else len(prompt_ids)
        self.stream = stream  # post a "chunk" event per decode step
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.finished = False  # set on the event loop when "end" is delivered
        self.client_gone = False  # set on the event loop when the client disconnected
        self.queued_at = 0.0  # time.perf_counter() when submitted
        self.generated = [0] * len(samplings)  # per choice, counted by the worker thread

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def post(self, event: Event) -> None:
        """Called from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()

    async def next_event(self) -> Event:
        event = await self.events.get()
        if event.kind == "end":
            self.finished = True
        return event


class QueueFull(Exception):
    pass


class JobQueue(queue.Queue):
    """The bounded job queue, which can drop the jobs cancelled while they waited."""

    def live(self) -> int:
        """Queued jobs not cancelled (the waiting gauge)."""
        with self.mutex:
            return sum(1 for job in self.queue if job is not None and not job.cancelled)

    def purge(self) -> list[Job]:
        """Remove the cancelled jobs and return them (their places free at once)."""
        with self.mutex:
            dead = [job for job in self.queue if job is not None and job.cancelled]
            if dead:
                self.queue = deque(job for job in self.queue if job is None or not job.cancelled)
                self.unfinished_tasks -= len(dead)
                self.not_full.notify(len(dead))
        return dead


@dataclass
class RunningJob:
    """A job in the batch: its choices waiting for a slot and its sequences in the batch."""
    job: Job
    waiting: deque = field(default_factory=deque)  # (index, SamplingParams) not yet in the batch
    running: dict = field(default_factory=dict)  # id(seq) -> (seq, index)
