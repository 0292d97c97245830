"""Continuous batching: many generations share each target pass.

Decoding is bound by reading the weights, so one pass over the rows of B sequences costs far
less than B passes. The BatchEngine holds up to max_batch Sequences, each in its own slot of
one batched KV cache; sequences join (`add`) and leave (finished, or `cancel`) between steps.
A step:
1. prefills waiting prompts, in chunks of at most `prefill_chunk` tokens per step, so a long
   prompt does not stall the sequences already decoding (a prompt that fits in one chunk is
   prefilled in one pass, exactly as Engine.start does);
2. picks one K for the batch and lets every decoding sequence draft up to it;
3. scores every sequence's [last token] + drafts in ONE target pass (rows packed through the
   projections, padded to the widest sequence only inside attention, where a mask keeps
   each row to its own slot: models/batch.py);
4. verifies each sequence with its own sampling settings, exactly as Engine._verify_chain
   does (engine.chain_verdict), rolls its slot back past its rejected drafts, and applies its
   stop rules (EOS, stop strings, max tokens, context).

K: one per step for the whole batch (batch_controller.py), from the measured costs of
batched passes and each sequence's acceptance (its own DraftLengthController); a sequence
drafts min(K, what it can), and K is capped at max_rows // n - 1 for n sequences in the
pass (attention pads to the widest). A fixed K (draft_tokens) is used as is.

Drafting: `ngram` per sequence (no model); `draft` (when the decoder's method is draft) as one
batched draft-model pass per draft position (proposers/batch_draft.py), the draft model
holding a cache slot per sequence, in the target's slot numbers. Tree methods (medusa,
eagle) are not batched yet. A decoder's batch offers `none`, `ngram` and its own method when
batched, per sequence."""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from specdec.engine.sequence import GenerationResult, Sequence, StreamChunk
from specdec.engine.single import Engine, chain_verdict
from specdec.errors import SpecdecError
from specdec.models.batch import BatchRunner
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import last_entries, token_logprobs
from specdec.spec.batch_controller import BatchDraftLength
from specdec.spec.proposers.base import Proposal, Proposer
from specdec.spec.proposers.batch_draft import BatchDraftModel, DraftRequest
from specdec.spec.proposers.draft_model import DraftModelProposer
from specdec.spec.proposers.prompt_lookup import PromptLookupProposer
from specdec.stats import StepRecord

BATCHED_METHODS = ("none", "ngram", "draft")


@dataclass
class BatchEntry:
    """A sequence in a slot of the batch."""
    seq: Sequence
    method: str
    proposer: Proposer | None  # a per-sequence drafter (ngram); None for none and draft
    prefilled: int = 0  # tokens of prompt_ids[:-1] already in the slot's cache

    @property
    def ready(self) -> bool:
        """Prefilled: the slot holds the whole context but its last token."""
        return self.prefilled >= len(self.seq.prompt_ids) - 1


@dataclass
class BatchEvent:
    """What one engine step did for one sequence: step is None when the sequence only
    prefilled (part of) its prompt."""
    seq: Sequence
    step: StepRecord | None


class BatchEngine:
    def __init__(self, engine: Engine, max_batch: int = 8, prefill_chunk: int = 512, max_rows: int = 64,
                 calibrate: bool = False):
        model = getattr(engine.target, "model", None)
        if not getattr(engine.target, "supports_tree", False) or model is None:
            raise SpecdecError("batched decoding needs the native runtime (llama, mistral, qwen2)")
        if max_batch < 1 or prefill_chunk < 1 or max_rows < max_batch:
            raise SpecdecError("need max_batch >= 1, prefill_chunk >= 1 and max_rows >= max_batch")
        self.engine = engine
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.max_rows = max_rows
        self.runner = BatchRunner(model, max_batch, engine.target.max_len)
        self.proposers: dict[str, Proposer | None] = {"none": None, "ngram": PromptLookupProposer()}
        if engine.method == "ngram":
            self.proposers["ngram"] = engine.proposer
        self.draft: BatchDraftModel | None = None  # the draft model's slots, for method draft
        if engine.method == "draft" and isinstance(engine.proposer, DraftModelProposer):  # not a cross-vocab draft
            self.draft = BatchDraftModel(engine.proposer.runner.model, max_batch,
                                         min(engine.target.max_len, engine.proposer.runner.max_len))
            self.proposers["draft"] = None
        self.entries: list[BatchEntry] = []  # entries[b] is in slot b
        self.width = BatchDraftLength()  # the batch's K (unless the engine fixes K)
        if calibrate:
            self.calibrate()

    def calibrate(self, context: int = 8, repeats: int = 2) -> None:
        """Time (and warm up) batched target passes over 1, 2, 4, ... max_rows rows (n
        sequences of `context` tokens, n * width = rows) and, for the draft model, batched
        draft passes over 1, 2, 4, ... sequences: the batch's K starts from these costs."""
        if self.entries:
            raise SpecdecError("calibrate an empty batch")
        filler = min(self.engine.eos_ids) if self.engine.eos_ids else 0
        prefix = [filler] * context
        for slot in range(self.max_batch):
            self.runner.extend_slot(slot, prefix, want_logits=False)
            if self.draft is not None:
                self.draft.prefill(slot, prefix)

        def best(fn, *args) -> float:
            fn(*args)  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn(*args)
                times.append(time.perf_counter() - t0)
            return min(times)

        def target_pass(n: int, width: int) -> None:
            self.runner.extend([[filler] * width] * n, [self.engine.exact] * n)
            for slot in range(n):
                self.runner.rollback(slot, context)

        def draft_pass(n: int) -> None:
            self.draft.runner.extend([[filler]] * n)
            for slot in range(n):
                self.draft.runner.rollback(slot, context)

        rows = 1
        while rows <= self.max_rows:
            n = min(self.max_batch, rows)
            self.width.target.observe(n * (rows // n), best(target_pass, n, rows // n))
            if self.draft is not None and rows <= self.max_batch:
                self.width.draft.observe(rows, best(draft_pass, rows))
            rows *= 2
        for slot in range(self.max_batch):
            self.runner.rollback(slot, 0)
            if self.draft is not None:
                self.draft.reset(slot)

    @property
    def method(self) -> str:
        return self.engine.method if self.engine.method in self.proposers else "none"

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, prompt: str | list[int], params: SamplingParams, method: str | None = None) -> Sequence:
        """A new sequence in the next free slot; its prompt is prefilled by the next steps."""
        method = method or self.method
        self._check_method(method)
        if not self.free_slots:
            raise SpecdecError(f"the batch is full ({self.max_batch} sequences)")
        proposer = self.proposers[method]
        seq = self.engine.new_sequence(prompt, params, controller=self.engine.new_controller(), method=method)
        if proposer is not None:
            proposer.reset(seq.prompt_ids)
        self.runner.rollback(len(self.entries), 0)
        if self.draft is not None:
            self.draft.reset(len(self.entries))
        self.entries.append(BatchEntry(seq, method, proposer))
        return seq

    def _check_method(self, method: str) -> None:
        if method not in self.proposers:
            raise SpecdecError(f"method {method!r} is not batched here; this batch offers "
                               f"{', '.join(self.proposers)} (draft when the decoder's method is draft)")

    def cancel(self, seq: Sequence) -> None:
        """Drop a sequence (finished or not) and free its slot."""
        for slot, entry in enumerate(self.entries):
            if entry.seq is seq:
                self._release(slot)
                return

    def finish(self, seq: Sequence) -> tuple[GenerationResult, str]:
        """The result of a finished sequence, and its text held back until now."""
        return self.engine.finish(seq)

    def stream_chunks(self, event: BatchEvent) -> list[StreamChunk]:
        """The chunks Engine.stream yields for this step of the sequence: one per step, and
        when the sequence finished, a last one with its result (carrying the step's tokens
        when EOS or a stop string ended it, as Engine.stream does)."""
        seq, step = event.seq, event.step
        if step is None:
            return []
        prompt_logprobs = seq.prompt_logprobs if seq.stats.target_forwards == 1 else None  # with the first chunk
        chunks = []
        if not step.stopped:
            chunks.append(StreamChunk(step.text, list(step.new_tokens), step=step, prompt_logprobs=prompt_logprobs,
                                      token_logprobs=last_entries(seq.token_logprobs, len(step.new_tokens))))
            prompt_logprobs = None
        if seq.finish_reason is not None:
            result, tail = self.finish(seq)
            last = step if step.stopped else None
            tokens = list(step.new_tokens) if last is not None else []
            chunks.append(StreamChunk((step.text if last is not None else "") + tail, tokens, result, step=last,
                                      token_logprobs=last_entries(seq.token_logprobs, len(tokens)),
                                      prompt_logprobs=prompt_logprobs))
        return chunks

    def _release(self, slot: int) -> None:
        """Free a slot, keeping the running sequences in slots [0, n): the last one moves in."""
        last = len(self.entries) - 1
        if slot != last:
            self.runner.move(last, slot)
            if self.draft is not None:
                self.draft.move(last, slot)
            self.entries[slot] = self.entries[last]
        self.entries.pop()
        self.runner.rollback(last, 0)
        if self.draft is not None:
            self.draft.reset(last)

    # ---------------------------------------------------------------- one step
    def step(self) -> list[BatchEvent]:
        """Prefill work, then one decode step for every prefilled sequence (one target pass):
        one event per sequence that did something. Finished sequences leave the batch (their
        events carry finish_reason; `finish` gives the result)."""
        events = self._prefill()
        ready = [slot for slot, entry in enumerate(self.entries) if entry.ready]
        if ready:
            decoded = self._decode(ready)
            seqs = {id(event.seq) for event in decoded}
            events = [event for event in events if id(event.seq) not in seqs] + decoded  # one event per sequence
        for slot in reversed(range(len(self.entries))):
            if self.entries[slot].seq.finish_reason is not None:
                self._release(slot)
        return events

    def _prefill(self) -> list[BatchEvent]:
        events, spent = [], 0
        for slot, entry in enumerate(self.entries):
            if spent >= self.prefill_chunk:
                break
            if entry.ready:
                continue
            seq, t0 = entry.seq, time.perf_counter()
            ids = seq.prompt_ids[entry.prefilled:min(entry.prefilled + self.prefill_chunk, len(seq.prompt_ids) - 1)]
            logits = self.runner.extend_slot(slot, ids, want_logits=seq.params.prompt_logprobs is not None)
            if entry.method == "draft":
                self.draft.prefill(slot, ids)
            if seq.params.prompt_logprobs is not None:
                follow = seq.prompt_ids[entry.prefilled + 1:entry.prefilled + 1 + len(ids)]
                seq.prompt_logprobs += token_logprobs(logits, follow, seq.params.prompt_logprobs)
            entry.prefilled += len(ids)
            spent += len(ids)
            seq.stats.prefill_seconds += time.perf_counter() - t0
            events.append(BatchEvent(seq, None))
        return events

    def _limits(self, ready: list[int]) -> list[int]:
        """The most drafts each sequence may take this step: its method's and its tokens'
        limits, and max_rows // n - 1 so that the padded pass holds at most max_rows rows."""
        cap = self.max_rows // len(ready) - 1
        max_k = self.engine.fixed_draft_tokens or self.engine.max_draft_tokens
        limits = []
        for slot in ready:
            entry = self.entries[slot]
            seq = entry.seq
            room = self.runner.max_len - len(seq.context)
            limits.append(0 if entry.method == "none" else max(0, min(max_k, seq.remaining - 1, room - 1, cap)))
        return limits

    def _choose_k(self, ready: list[int], limits: list[int]) -> int:
        """A fixed K (draft_tokens), else the batch's K from measured costs (batch_controller.py)."""
        if self.engine.fixed_draft_tokens is not None:
            return self.engine.fixed_draft_tokens
        expected = [self.entries[slot].seq.controller.expected_tokens for slot in ready]
        drafting = sum(1 for slot, lim in zip(ready, limits) if lim and self.entries[slot].method == "draft")
        return self.width.choose(limits, expected, self.max_rows // len(ready) - 1, drafting)

    def _decode(self, ready: list[int]) -> list[BatchEvent]:
        limits = self._limits(ready)
        early = self._propose_each(ready, limits)  # cheap drafters first: K then knows their matches
        limits = [len(early[slot][0].tokens) if slot in early else lim for slot, lim in zip(ready, limits)]
        k = self._choose_k(ready, limits)
        budgets = [min(k, lim) for lim in limits]
        proposals, draft_seconds, model_seconds = self._propose(ready, budgets, early)
        rows: list[list[int]] = [[] for _ in range(ready[-1] + 1)]
        exact = [False] * len(rows)
        for slot, proposal in zip(ready, proposals):
            seq = self.entries[slot].seq
            rows[slot] = [seq.context[-1]] + proposal.tokens
            exact[slot] = self.engine.exact_for(seq)
        t0 = time.perf_counter()
        logits = self.runner.extend(rows, exact)
        target_seconds = time.perf_counter() - t0
        drafting = [b for slot, b in zip(ready, budgets) if b and self.entries[slot].method == "draft"]
        self.width.observe(sum(len(r) for r in rows), target_seconds, len(drafting),
                           max(drafting, default=0), model_seconds)
        events = []
        for slot, budget, proposal, drafted_in in zip(ready, budgets, proposals, draft_seconds):
            entry, t1 = self.entries[slot], time.perf_counter()
            seq = entry.seq
            verdict = chain_verdict(seq, proposal, logits[slot])
            n = verdict.num_accepted
            self.runner.rollback(slot, len(seq.context) + n)  # the context but its new last token
            step = self.engine.emit(seq, proposal.tokens[:n] + [verdict.next_token], logits[slot], budget, proposal,
                                    n, drafted_in, target_seconds, other_since=t1, observe=entry.method != "none")
            events.append(BatchEvent(seq, step))
        return events

    def _propose_each(self, ready: list[int], limits: list[int]) -> dict[int, tuple[Proposal, float]]:
        """Per-sequence drafters (prompt lookup) at each sequence's limit, with their seconds."""
        out = {}
        for slot, limit in zip(ready, limits):
            entry, t0 = self.entries[slot], time.perf_counter()
            if entry.proposer is not None and limit > 0:
                seq = entry.seq
                proposal = entry.proposer.propose(seq.context, limit, seq.params, seq.generator,
                                                  history=seq.history, noise=seq.noise)
                out[slot] = (proposal, time.perf_counter() - t0)
        return out

    def _propose(self, ready: list[int], budgets: list[int], early: dict[int, tuple[Proposal, float]]
                 ) -> tuple[list[Proposal], list[float], float]:
        """Each sequence's drafts and the seconds it waited for them: the early proposals cut
        to the budget (a shorter lookup gives their prefix), the draft model's sequences
        together in batched passes (whose seconds come third)."""
        proposals: dict[int, Proposal] = {}
        seconds: dict[int, float] = {}
        requests = []
        for slot, budget in zip(ready, budgets):
            seq = self.entries[slot].seq
            if budget > 0 and self.entries[slot].method == "draft":
                requests.append(DraftRequest(slot, seq.context, budget, seq.params, seq.generator,
                                             seq.history, seq.noise))
            elif budget > 0:
                proposal, seconds[slot] = early[slot]
                probs = proposal.draft_probs
                proposals[slot] = Proposal(proposal.tokens[:budget], None if probs is None else probs[:budget],
                                           sync_seconds=proposal.sync_seconds)
            else:
                proposals[slot], seconds[slot] = Proposal([]), early[slot][1] if slot in early else 0.0
        elapsed = 0.0
        if requests:
            t0 = time.perf_counter()
            drafted = self.draft.propose(requests)
            elapsed = time.perf_counter() - t0
            for r in requests:
                proposals[r.slot] = drafted.get(r.slot, Proposal([]))
                seconds[r.slot] = elapsed
        return [proposals[slot] for slot in ready], [seconds[slot] for slot in ready], elapsed

    # ---------------------------------------------------------------- offline batches
    def generate(self, requests: Iterable[tuple[str | list[int], SamplingParams, str | None]]
                 ) -> list[GenerationResult]:
        """Run (prompt, params, method) requests through the batch, admitting a waiting
        request whenever a slot frees; results in request order."""
        waiting = list(enumerate(requests))
        for _, (prompt, _, method) in waiting:  # fail before any work
            self.engine.encode_prompt(prompt)
            self._check_method(method or self.method)
        waiting.reverse()
        index: dict[int, int] = {}
        results: list[GenerationResult | None] = [None] * len(waiting)
        while waiting or self.entries:
            while waiting and self.free_slots:
                i, (prompt, params, method) = waiting.pop()
                index[id(self.add(prompt, params, method))] = i
            for event in self.step():
                if event.seq.finish_reason is not None:
                    results[index.pop(id(event.seq))] = self.finish(event.seq)[0]
        return results
