"""What each sequence of a batched step drafts (the drafting half of engine/scheduler.py): the
drafters a batch offers (prompt lookup per sequence, the draft model's batched slots; a tree
method's head or a draft with another tokenizer forked per sequence; EAGLE's forks read their
one-node drafts together), how many drafts each sequence takes within its limit
(engine/batch_limits.py), the chains' one K from measured batched pass costs (spec/control/batch_width.py;
trees size themselves with their sequence's controller), and the proposals, the draft model's
sequences together in batched passes (spec/proposers/batch_draft.py)."""
from __future__ import annotations

import time

from specdec.engine.batch_limits import BatchEntry, draft_limits, one_node_each, reads_with_others
from specdec.engine.core import Engine
from specdec.engine.sequence import Sequence
from specdec.errors import SpecdecError
from specdec.models.batch import BatchRunner
from specdec.spec.calibrate import measure_batch_costs
from specdec.spec.control.batch_width import BatchDraftLength
from specdec.spec.control.draft_length import DraftLengthController
from specdec.spec.control.forked_gate import ForkedGate
from specdec.spec.proposers.base import Proposal, Proposer
from specdec.spec.proposers.batch_draft import BatchDraftModel, DraftRequest
from specdec.spec.proposers.batch_eagle import BatchEagleHeads
from specdec.spec.proposers.draft_model import DraftModelProposer
from specdec.spec.proposers.eagle import EagleProposer
from specdec.spec.proposers.prompt_lookup import PromptLookupProposer

BATCHED_METHODS = ("none", "ngram", "draft", "medusa", "eagle")
STAND_IN_TOKENS = 4  # prompt lookup's drafts a step while a lone draft model waits (a 5-token pass ~1.2x a 1-token one)


class BatchDrafting:
    def __init__(self, engine: Engine, max_batch: int, max_rows: int):
        self.engine = engine
        self.max_rows = max_rows
        self.proposers: dict[str, Proposer | None] = {"none": None, "ngram": PromptLookupProposer()}
        if engine.method == "ngram":
            self.proposers["ngram"] = engine.proposer
        self.draft: BatchDraftModel | None = None  # the draft model's slots, for method draft
        # a drafter with per-sequence state and no batched form yet (a tree method's head, a
        # draft with another tokenizer): forked per sequence; forks not in use wait here. A
        # batch of one drafts with the decoder's own drafter, whatever it is
        self.forked_method: str | None = None
        self.forks: list[Proposer] = []
        self.own = max_batch == 1 and engine.method not in self.proposers
        if self.own:
            self.proposers[engine.method] = None
            self.forked_method = engine.method
        elif engine.method == "draft" and isinstance(engine.proposer, DraftModelProposer):  # not a cross-vocab draft
            self.draft = BatchDraftModel(engine.proposer.runner.model, max_batch,
                                         min(engine.target.max_len, engine.proposer.runner.max_len))
            self.proposers["draft"] = None
        if engine.method not in self.proposers and hasattr(engine.proposer, "fork"):
            self.proposers[engine.method] = None
            self.forked_method = engine.method
        # EAGLE's forks on the slots of one head cache, their one-node drafts read together
        self.eagle_heads: BatchEagleHeads | None = None
        if not self.own and isinstance(engine.proposer, EagleProposer) and engine.proposer.head.stack is not None:
            self.eagle_heads = BatchEagleHeads(engine.proposer, max_batch)
        # how much prompt lookup drafts while it stands in for a lone draft model (lookup_while_unread)
        self.stand_in: DraftLengthController | None = None
        self.width = BatchDraftLength()  # the batch's K (unless the engine fixes K)
        self.gate = ForkedGate(self.width)  # whether forked drafters draft at all this step
        # the slots whose own controller chose their budget in the last plan (a sequence alone, a
        # tree): a step teaches a controller only what it chose or drafted (teaches)
        self.chose: set[int] = set()

    def calibrate(self, runner: BatchRunner, max_batch: int, exact: bool, filler: int) -> None:
        """The batch's K starts from timed batched passes (spec/calibrate.py); the batch must be empty."""
        measure_batch_costs(runner, self.draft, self.width, max_batch, self.max_rows, exact, filler)

    @property
    def method(self) -> str:
        """The decoder's method if the batch offers it, else plain decoding."""
        return self.engine.method if self.engine.method in self.proposers else "none"

    def check_method(self, method: str) -> None:
        if method not in self.proposers:
            raise SpecdecError(f"method {method!r} is not batched here; this batch offers "
                               f"{', '.join(self.proposers)} (a decoder batches its own method besides none and ngram)")

    def entry(self, seq: Sequence, method: str) -> BatchEntry:
        """A new sequence's entry with its drafter: the shared prompt lookup, a free fork of
        the decoder's own drafter, or None (plain decoding; the draft model's batched slots)."""
        if method == self.forked_method and self.own:
            return BatchEntry(seq, method, self.engine.proposer, True)
        if method == self.forked_method:
            fork = (self.forks.pop() if self.forks else self.eagle_heads.fork() if self.eagle_heads is not None
                    else self.engine.proposer.fork())
            return BatchEntry(seq, method, fork, True)
        return BatchEntry(seq, method, self.proposers[method])

    def teaches(self, entry: BatchEntry, slot: int, budget: int) -> bool:
        """Whether the step of the sequence in slot is its controller's to learn from: one it
        drafted in, or whose budget its controller chose. A step the batch kept plain (its K, its
        gate) was no choice of the controller's, and its seconds are the whole batch's pass: at
        16 sequences such steps are nearly all of them, and observing each one cost ~1% of the
        batch's time."""
        return entry.method != "none" and (budget > 0 or slot in self.chose)

    def in_draft_pass(self, entry: BatchEntry) -> bool:
        """Whether entry drafts in the draft model's batched passes (not a fork of its own)."""
        return self.draft is not None and entry.method == "draft"

    def release(self, entry: BatchEntry) -> None:
        """A sequence left the batch: its fork serves the next one."""
        if entry.forked and not self.own:
            self.forks.append(entry.proposer)

    def plan(self, entries: list[BatchEntry], ready: list[int], runner: BatchRunner
             ) -> tuple[list[int], list[Proposal], list[float], float]:
        """The step's budget (drafts; a tree: nodes) and proposal for each ready slot, the
        seconds each waited for it, and the draft model's batched seconds."""
        limits = draft_limits(entries, ready, runner, self.max_rows // len(ready) - 1,
                              self.engine.fixed_draft_tokens or self.engine.max_draft_tokens)
        alone = len(ready) == 1  # a sequence alone sizes its drafts with its own controller, then drafts
        # with several, cheap drafters first: the batch's K then knows their matches
        early = {} if alone else self.propose_each(entries, ready, limits)
        limits = [len(early[slot][0].tokens) if slot in early else lim for slot, lim in zip(ready, limits)]
        together = (not alone and self.eagle_heads is not None and self.engine.fixed_draft_tokens is None
                    and one_node_each(entries, ready, limits))
        forked_on = self.forked_gate(entries, ready, limits, together)
        k = 0 if alone else self.choose_k(entries, ready, limits, forked_on)
        budgets, self.chose = [], set()
        for slot, lim in zip(ready, limits):
            if entries[slot].forked and not forked_on:
                budgets.append(0)
            elif together and entries[slot].forked and lim:
                budgets.append(1)  # the gate measured the batch's nodes read together paying
            elif (alone or entries[slot].tree) and lim:
                budgets.append(self.own_budget(entries[slot], lim, alone))
                self.chose.add(slot)
            else:
                budgets.append(min(k, lim))
        if alone and not budgets[0]:
            early = self.lookup_while_unread(entries[ready[0]], ready[0], limits[0])
            budgets = [len(early[ready[0]][0].tokens)] if early else budgets
        return (budgets, *self.propose(entries, ready, budgets, early))

    @staticmethod
    def own_budget(entry: BatchEntry, limit: int, alone: bool) -> int:
        """A sequence's budget from its own controller; a lone draft model's read of what its
        cache lacks (its prompt: read at the first draft) counts against drafting's saving
        over the tokens left, and never delays the first token. A request that went on from an
        earlier one's cache (its prompt reused a prefix: an editor's next completion, a chat's
        next turn) is taken to have one more like it after it, for which the draft keeps what it
        reads (DraftModelProposer.reset): the saving over both then repays the read. A one-off
        request keeps to its own tokens."""
        upfront = getattr(entry.proposer, "upfront_seconds", None)
        seq = entry.seq
        if not alone or entry.tree or upfront is None:
            return seq.controller.choose(limit)
        horizon = seq.remaining + (seq.params.max_new_tokens if seq.stats.cached_prompt_tokens else 0)
        return seq.controller.choose(limit, upfront_seconds=upfront(seq.context), horizon=horizon,
                                     first_token=not seq.generated)

    def lookup_while_unread(self, entry: BatchEntry, slot: int, limit: int) -> dict[int, tuple[Proposal, float]]:
        """Where a lone draft model is held back by its unread prompt alone (own_budget: its
        controller would draft but for the read) and decoding is greedy: prompt lookup's drafts
        instead (nothing to read; code repeats its prompt), as many as the stand-in's own
        controller finds worth it (STAND_IN_TOKENS at most; its steps teach that controller, not
        the draft's). {} where none."""
        seq = entry.seq
        if not limit or not seq.params.greedy or entry.tree or not getattr(seq.controller, "held_back", False):
            return {}
        if self.stand_in is None:
            self.stand_in = self.engine.new_controller(False)
            self.stand_in.max_k, self.stand_in.draft_seconds_per_token = STAND_IN_TOKENS, None
        k = self.stand_in.choose(limit)
        if not k:
            return {}
        t0 = time.perf_counter()
        proposal = self.proposers["ngram"].propose(seq.context, k, seq.params, None, history=seq.history,
                                                   noise=seq.noise)
        if not proposal.tokens:
            return {}
        proposal.stand_in = True
        return {slot: (proposal, time.perf_counter() - t0)}

    def forked_gate(self, entries: list[BatchEntry], ready: list[int], limits: list[int],
                    together: bool = False) -> bool:
        """Whether the forked drafters may draft this step (spec/control/forked_gate.py); True
        where none would, and for a sequence alone (its controller sees its drafter's cost)."""
        self.gate.current = None
        if self.engine.fixed_draft_tokens is not None or len(ready) == 1 or not any(
                entries[slot].forked and lim for slot, lim in zip(ready, limits)):
            return True
        return self.gate.allows(len(ready), [(entries[slot].seq.controller, lim) for slot, lim in zip(ready, limits)
                                             if entries[slot].forked and lim], together)

    def choose_k(self, entries: list[BatchEntry], ready: list[int], limits: list[int], forked_on: bool = True) -> int:
        """The chains' K: a fixed K (draft_tokens), else the batch's K from measured costs
        (spec/control/batch_width.py), over the chains that may draft (a forked one: where the
        gate lets it). Trees size themselves (their sequence's controller)."""
        if self.engine.fixed_draft_tokens is not None:
            return self.engine.fixed_draft_tokens
        chains = [(slot, lim if forked_on or not entries[slot].forked else 0)  # a gated one is a plain row
                  for slot, lim in zip(ready, limits) if not entries[slot].tree]
        if not chains:
            return 0
        expected = [entries[slot].seq.controller.expected_tokens for slot, _ in chains]
        drafting = sum(1 for slot, lim in chains if lim and self.in_draft_pass(entries[slot]))
        return self.width.choose([lim for _, lim in chains], expected, self.max_rows // len(ready) - 1, drafting)

    def propose_each(self, entries: list[BatchEntry], ready: list[int], limits: list[int]
                     ) -> dict[int, tuple[Proposal, float]]:
        """The shared cheap drafter (prompt lookup) at each sequence's limit, with its seconds (a
        forked drafter proposes once, at its budget, in propose)."""
        out = {}
        for slot, limit in zip(ready, limits):
            entry, t0 = entries[slot], time.perf_counter()
            if entry.proposer is not None and not entry.forked and limit > 0:
                seq = entry.seq
                proposal = entry.proposer.propose(seq.context, limit, seq.params, seq.generator,
                                                  history=seq.history, noise=seq.noise)
                out[slot] = (proposal, time.perf_counter() - t0)
        return out

    def propose_eagle_nodes(self, entries: list[BatchEntry], ready: list[int], budgets: list[int],
                            early: dict[int, tuple[Proposal, float]], proposals: dict[int, Proposal],
                            seconds: dict[int, float]) -> None:
        """The one-node drafts of EAGLE forks that may be read together (batch_limits.reads_with_others),
        read together (spec/proposers/batch_eagle.py), into proposals and seconds; with fewer than
        two of them, each fork drafts alone."""
        if self.eagle_heads is None:
            return
        slots = [slot for slot, budget in zip(ready, budgets)
                 if budget == 1 and entries[slot].forked and slot not in early and reads_with_others(entries[slot].seq)]
        if len(slots) < 2:
            return
        t0 = time.perf_counter()
        drafted, sync_seconds = self.eagle_heads.propose_one([entries[slot].proposer for slot in slots],
                                                             [entries[slot].seq.context for slot in slots],
                                                             entries[slots[0]].seq.params)
        elapsed = time.perf_counter() - t0
        for slot, proposal in zip(slots, drafted):
            proposal.sync_seconds = sync_seconds / len(slots)
            proposals[slot], seconds[slot] = proposal, elapsed
        self.gate.observe_drafting(elapsed - sync_seconds, len(slots), together=True)

    def propose(self, entries: list[BatchEntry], ready: list[int], budgets: list[int],
                early: dict[int, tuple[Proposal, float]]
                 ) -> tuple[list[Proposal], list[float], float]:
        """Each sequence's drafts and the seconds it waited for them: the early proposals cut
        to the budget (a shorter lookup gives their prefix), the draft model's sequences
        together in batched passes (whose seconds come third)."""
        proposals: dict[int, Proposal] = {}
        seconds: dict[int, float] = {}
        requests = []
        self.propose_eagle_nodes(entries, ready, budgets, early, proposals, seconds)
        for slot, budget in zip(ready, budgets):
            seq = entries[slot].seq
            if slot in proposals:
                continue
            if budget > 0 and slot in early:  # the shared lookup's, or a stand-in (lookup_while_unread)
                proposal, seconds[slot] = early[slot]
                probs = proposal.draft_probs
                proposals[slot] = Proposal(proposal.tokens[:budget], None if probs is None else probs[:budget],
                                           sync_seconds=proposal.sync_seconds, stand_in=proposal.stand_in)
            elif budget > 0 and entries[slot].proposer is not None:
                # its own drafter, or a sequence alone: drafts at its budget
                t0 = time.perf_counter()
                proposer = entries[slot].proposer
                floor = (seq.controller.confidence_floor()  # where it stops drafting (None: at its budget)
                         if getattr(proposer, "stops_at_floor", False) and hasattr(seq.controller, "confidence_floor")
                         else None)
                proposals[slot] = proposer.propose(seq.context, budget, seq.params, seq.generator, history=seq.history,
                                                   noise=seq.noise, **({} if floor is None else {"floor": floor}))
                seconds[slot] = time.perf_counter() - t0
                if entries[slot].forked:  # what a batch's forks cost one after another (ForkedGate); not
                    # their catch-up, which holds a whole prompt at a sequence's first draft
                    self.gate.observe_drafting(seconds[slot] - proposals[slot].sync_seconds, budget)
            elif budget > 0 and entries[slot].method == "draft":
                requests.append(DraftRequest(slot, seq.context, budget, seq.params, seq.generator,
                                             seq.history, seq.noise))
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
