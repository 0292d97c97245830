"""The decode loop, for one request or many: generations share each target pass.

Decoding is bound by reading the weights, so one pass over the rows of B sequences costs far
less than B passes. The Scheduler holds up to max_batch Sequences, each in its own slot of
one KV cache; sequences join (`add`) and leave (finished, or `cancel`) between steps. A lone
request (`stream`, `generate_one`; SpecDecoder.generate and stream) is a batch of one: the
decoder's own runner (any backend, models/one_slot.py), drafter and controllers, its prompt
prefilled in one pass. A step:
1. prefills waiting prompts, in chunks of at most `prefill_chunk` tokens per step, so a long
   prompt does not stall the sequences already decoding;
2. lets every decoding sequence draft (batch_drafting.py: a sequence alone sizes its drafts
   with its own controller; several: one K for the chains, a tree per tree-method sequence);
3. scores every sequence's [last token] + drafts in ONE target pass (rows packed through the
   projections, padded to the widest sequence only inside attention, where a mask keeps
   each row to its own slot: models/batch.py);
4. verifies each sequence with its own sampling settings (verdicts.chain_verdict /
   tree_verdict), rolls its slot back past its rejected drafts (a tree: keeps the accepted
   path), and applies its stop rules (EOS, stop strings, max tokens, context).

Invariant: a slot's cache holds its sequence's context except the last token, which is fed
first in the next step (so its logits come out of the same pass that scores the drafts). A
finished sequence in the last slot leaves its cache there: the next prompt that shares its
leading tokens skips them (prefix reuse, where the runner's rows are batch-invariant).

What each sequence drafts, and how much (one K for a batch's chains, a tree per tree-method
sequence, a forked drafter per sequence where it has no batched form): batch_drafting.py. A
decoder's batch offers `none`, `ngram` and its own method when batched, per sequence."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.engine.batch_drafting import BatchDrafting
from specdec.engine.batch_limits import TREE_METHODS, BatchEntry
from specdec.engine.core import Engine
from specdec.engine.sequence import GenerationResult, Sequence
from specdec.engine.verdicts import chain_verdict, tree_verdict
from specdec.errors import SpecdecError
from specdec.models.batch import BatchRunner
from specdec.models.cache import PassPlan, shared_prefix
from specdec.models.one_slot import OneSlotRunner
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import token_logprobs
from specdec.spec.control.base import Controller
from specdec.spec.proposers.base import Proposer
from specdec.spec.verify import tree_attention_mask
from specdec.stats import StepRecord


@dataclass
class StepEvent:
    """What one engine step did for one sequence: step is None when the sequence only
    prefilled (part of) its prompt."""
    seq: Sequence
    step: StepRecord | None


class Scheduler:
    def __init__(self, engine: Engine, max_batch: int = 8, prefill_chunk: int = 512, max_rows: int = 64,
                 calibrate: bool = False):
        if max_batch < 1 or prefill_chunk < 1 or max_rows < max_batch:
            raise SpecdecError("need max_batch >= 1, prefill_chunk >= 1 and max_rows >= max_batch")
        self.engine = engine
        self.max_batch = max_batch
        self.max_rows = max_rows
        if max_batch == 1:
            # a lone request: the decoder's own runner (any backend) and drafter, the prompt
            # prefilled in one pass, prefix reuse across requests
            self.runner: BatchRunner | OneSlotRunner = OneSlotRunner(engine.target)
            prefill_chunk = engine.target.max_len
        else:
            model = getattr(engine.target, "model", None)
            if not getattr(engine.target, "supports_tree", False) or model is None:
                raise SpecdecError("batched decoding needs the native runtime (llama, mistral, qwen2)")
            self.runner = BatchRunner(model, max_batch, engine.target.max_len)
        self.prefill_chunk = prefill_chunk
        self.drafting = BatchDrafting(engine, max_batch, max_rows)
        self.draft = self.drafting.draft  # the draft model's slots (method draft), moved with the target's
        self.entries: list[BatchEntry] = []  # entries[b] is in slot b
        # a free slot's context whose all-but-last tokens its cache still holds (prefix reuse)
        self.held: list[list[int] | None] = [None] * max_batch
        # the drafter holding the target's features of each held context (one that needs_hidden)
        self.held_by: list[Proposer | None] = [None] * max_batch
        self.settled = True  # every slot's cache holds its tokens (no step failed midway)
        if calibrate:
            self.calibrate()

    def calibrate(self) -> None:
        """Time (and warm up) batched passes: the batch's K starts from their costs
        (batch_drafting.BatchDrafting.calibrate)."""
        if self.entries:
            raise SpecdecError("calibrate an empty batch")
        self.held, self.held_by = [None] * self.max_batch, [None] * self.max_batch
        if self.max_batch == 1:  # a lone sequence's K comes from its controller: the runner's pass costs
            self.engine.calibrate()
            return
        self.drafting.calibrate(self.runner, self.max_batch, self.engine.exact,
                                min(self.engine.eos_ids) if self.engine.eos_ids else 0)

    @property
    def method(self) -> str:
        return self.drafting.method

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, prompt: str | list[int], params: SamplingParams, method: str | None = None) -> Sequence:
        """A new sequence in the next free slot; its prompt is prefilled by the next steps."""
        method = method or self.method
        self.drafting.check_method(method)
        if not self.free_slots:
            raise SpecdecError(f"the batch is full ({self.max_batch} sequences)")
        seq = self.engine.new_sequence(prompt, params, controller=self._new_controller(method, params), method=method)
        entry = self.drafting.entry(seq, method)
        slot = len(self.entries)
        reused = self._reusable_prefix(slot, entry)
        self.held[slot] = self.held_by[slot] = None
        self.runner.rollback(slot, reused)
        entry.prefilled = seq.stats.cached_prompt_tokens = reused
        if entry.proposer is not None:
            # in a batch a drafter reads the prompt at its first draft (a cross-vocabulary draft
            # prefills it then), which the batch's gate may never allow: plain steps pay nothing
            prompt = seq.prompt_ids if self.max_batch == 1 else []
            if entry.needs_hidden:  # the kept prefix's features: the last sequence's (_reusable_prefix)
                entry.proposer.reset(prompt, kept_features=reused)
            else:
                entry.proposer.reset(prompt)
        if self.draft is not None:
            self.draft.reset(slot)
        self.entries.append(entry)
        return seq

    def _reusable_prefix(self, slot: int, entry: BatchEntry) -> int:
        """How many leading prompt tokens the free slot's cache holds already and may keep: an
        editor's requests share most of their text. Only where every cached row has the bits a
        fresh prefill would write (Runner.kv_rows_invariant), so output never depends on
        earlier requests."""
        held, seq = self.held[slot], entry.seq
        if (not self.engine.reuse_prefix or held is None or seq.params.prompt_logprobs is not None
                or not getattr(self.runner, "kv_rows_invariant", False)
                or self.runner.length(slot) != len(held) - 1):
            return 0
        limit = min(len(held), len(seq.prompt_ids)) - 1
        if entry.needs_hidden:  # a drafter that reads the target's features of every position (EAGLE)
            features = entry.proposer.features_kept()
            if features is not None:
                if self.held_by[slot] is not entry.proposer:
                    return 0  # those features left with another drafter (or were never kept)
                limit = min(limit, features)
        return shared_prefix(held, seq.prompt_ids, limit)

    def cancel(self, seq: Sequence) -> None:
        """Drop a sequence (finished or not) and free its slot."""
        for slot, entry in enumerate(self.entries):
            if entry.seq is seq:
                self._release(slot)
                return

    def _new_controller(self, method: str, params: SamplingParams) -> Controller:
        """A sequence's own controller (its acceptance; the batch's K reads each one's). With
        the decoder's own drafter it starts from what the engine's controller for these
        settings learned (finish hands each sequence's learning back), so a short request does
        not explore draft lengths or tree sizes from scratch."""
        if self.max_batch == 1 and method == self.engine.method:
            return self.engine.controller_for(params)  # a lone sequence: the engine's own, learning as it goes
        controller = self.engine.new_controller(method in TREE_METHODS)
        if method == self.engine.method and method != "none":
            try:
                controller.recall(self.engine.controller_for(params).memory())
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # nothing learned yet: start fresh
        return controller

    def finish(self, seq: Sequence) -> tuple[GenerationResult, str]:
        """The result of a finished sequence, and its text held back until now."""
        if self.max_batch == 1 and seq.stats.method == self.engine.method:  # the engine's own controller
            self.engine.remember(seq)
        elif seq.stats.method == self.engine.method and seq.stats.method != "none":
            shared = self.engine.controller_for(seq.params)
            try:
                shared.recall(seq.controller.memory())
            except (KeyError, TypeError, ValueError, AttributeError):
                pass
        return self.engine.finish(seq)

    def _release(self, slot: int) -> None:
        """Free a slot, keeping the running sequences in slots [0, n): the last one moves in. A
        sequence leaving the last slot (finished or cancelled between steps: an editor cancels
        as the user types) leaves its cache there for prefix reuse."""
        last = len(self.entries) - 1
        entry = self.entries[slot]
        self.drafting.release(entry)
        if slot != last:
            self.runner.move(last, slot)
            if self.draft is not None:
                self.draft.move(last, slot)
            self.entries[slot] = self.entries[last]
        self.entries.pop()
        keep = slot == last and self.settled and getattr(self.runner, "kv_rows_invariant", False)
        if keep:  # a last step's drafts past max_tokens or a stop were kept in the cache, not the text
            self.runner.rollback(last, min(self.runner.length(last), len(entry.seq.context) - 1))
        self.held[last] = entry.seq.context[:self.runner.length(last) + 1] if keep else None
        self.held_by[last] = entry.proposer if keep and entry.needs_hidden else None
        if not keep:
            self.runner.rollback(last, 0)
        if self.draft is not None:
            self.draft.reset(last)

    # ---------------------------------------------------------------- one step
    def step(self) -> list[StepEvent]:
        """Prefill work, then one decode step for every prefilled sequence (one target pass):
        one event per sequence that did something. Finished sequences leave the batch (their
        events carry finish_reason; `finish` gives the result)."""
        self.settled = False  # a step that fails midway leaves the caches unknown
        events = self._prefill()
        ready = [slot for slot, entry in enumerate(self.entries) if entry.ready]
        if ready:
            decoded = self._decode(ready)
            seqs = {id(event.seq) for event in decoded}
            events = [event for event in events if id(event.seq) not in seqs] + decoded  # one event per sequence
        self.settled = True
        for slot in reversed(range(len(self.entries))):
            if self.entries[slot].seq.finish_reason is not None:
                self._release(slot)
        return events

    def _prefill(self) -> list[StepEvent]:
        events, spent = [], 0
        for slot, entry in enumerate(self.entries):
            if spent >= self.prefill_chunk:
                break
            if entry.ready:
                continue
            seq, t0 = entry.seq, time.perf_counter()
            ids = seq.prompt_ids[entry.prefilled:min(entry.prefilled + self.prefill_chunk, len(seq.prompt_ids) - 1)]
            logits = self.runner.extend_slot(slot, ids, self.engine.exact_prefill(seq),
                                             want_logits=seq.params.prompt_logprobs is not None,
                                             want_hidden=entry.needs_hidden)
            if entry.method == "draft" and self.draft is not None:
                self.draft.prefill(slot, ids)
            if entry.needs_hidden:
                # the head reads the prompt's features at its first draft, which its controller
                # (at T=1 after a few steps) or the batch's gate may never allow
                entry.proposer.observe_target(self.runner.last_hidden[0])
            if seq.params.prompt_logprobs is not None:
                follow = seq.prompt_ids[entry.prefilled + 1:entry.prefilled + 1 + len(ids)]
                seq.prompt_logprobs += token_logprobs(logits, follow, seq.params.prompt_logprobs)
            entry.prefilled += len(ids)
            spent += len(ids)
            seq.stats.prefill_seconds += time.perf_counter() - t0
            events.append(StepEvent(seq, None))
        return events

    def _decode(self, ready: list[int]) -> list[StepEvent]:
        began = time.perf_counter()
        budgets, proposals, draft_seconds, model_seconds = self.drafting.plan(self.entries, ready, self.runner)
        rows: list[list[int]] = [[] for _ in range(ready[-1] + 1)]
        exact = [False] * len(rows)
        trees: list[torch.Tensor | None] = [None] * len(rows)
        for slot, proposal in zip(ready, proposals):
            seq = self.entries[slot].seq
            rows[slot] = [seq.context[-1]] + proposal.tokens
            exact[slot] = self.engine.exact_for(seq)
            if proposal.parents is not None:
                trees[slot] = tree_attention_mask(proposal.parents).to(torch.bool)
        t0 = time.perf_counter()
        logits = self.runner.forward(PassPlan(rows, exact, trees,
                                              want_hidden=any(self.entries[slot].needs_hidden for slot in ready)))
        target_seconds = time.perf_counter() - t0
        drafting = [b for slot, b in zip(ready, budgets) if b and self.drafting.in_draft_pass(self.entries[slot])]
        self.drafting.width.observe(sum(len(r) for r in rows), target_seconds, len(drafting),
                                    max(drafting, default=0), model_seconds)
        events = []
        for slot, budget, proposal, drafted_in in zip(ready, budgets, proposals, draft_seconds):
            entry, t1 = self.entries[slot], time.perf_counter()
            seq = entry.seq
            start = len(seq.context) - 1  # the slot's length before the pass
            if proposal.parents is None:
                verdict = chain_verdict(seq, proposal, logits[slot])
                n = verdict.num_accepted
                kept, tokens = list(range(n + 1)), proposal.tokens[:n] + [verdict.next_token]
                self.runner.rollback(slot, start + n + 1)
            else:
                verdict = tree_verdict(seq, proposal, logits[slot], self.engine.typical_acceptance)
                kept = [0] + [1 + i for i in verdict.path]
                tokens, n = [proposal.tokens[i] for i in verdict.path] + [verdict.next_token], len(verdict.path)
                self.runner.keep(slot, start, kept)
            # leading rows by a slice: indexing by a list of rows costs ~10 us a sequence a step
            rows_kept = slice(0, len(kept)) if kept == list(range(len(kept))) else kept
            if entry.needs_hidden:  # a copy: the drafter keeps it, and a view would keep the whole pass's
                entry.proposer.observe_target(self.runner.last_hidden[slot][rows_kept].clone())
            kept_logits = logits[slot][rows_kept] if seq.token_logprobs is not None else None  # logprobs only
            step = self.engine.emit(seq, tokens, kept_logits, budget, proposal, n, drafted_in,
                                    target_seconds, other_since=t1,
                                    observe=self.drafting.teaches(entry, slot, budget) and not proposal.stand_in)
            if proposal.stand_in:  # prompt lookup's drafts for a held-back draft model
                self.drafting.stand_in.observe(step)
            events.append(StepEvent(seq, step))
        self.drafting.gate.observe_step(sum(len(e.step.new_tokens) for e in events if e.step is not None),
                                        time.perf_counter() - began, len(ready), sum(p.sync_seconds for p in proposals))
        return events
