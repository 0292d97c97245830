"""The decode loop. Each step: the controller picks K, the proposer drafts up to K tokens, the
target scores [last token] + drafts in one forward pass, the verifier keeps a prefix plus one
target token, and both caches roll back past the rejected drafts.

Invariant: the target cache holds the context except its last token, which is fed first in
the next step (so its logits come out of the same pass that scores the drafts)."""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from specdec.engine.controllers import ControllerBank, new_controller
from specdec.engine.sequence import GenerationResult, Sequence, StreamChunk
from specdec.engine.text import TextStream, TextTokenizer
from specdec.engine.verdicts import Verified, chain_verdict, tree_verdict
from specdec.errors import SpecdecError
from specdec.models.cache import shared_prefix
from specdec.models.runner import Runner
from specdec.sampling import SamplingParams, make_generator
from specdec.sampling.grammar import GrammarCompiler, GrammarState
from specdec.sampling.logprobs import last_entries, token_logprobs
from specdec.sampling.penalties import history_for
from specdec.sampling.seeded import PositionNoise
from specdec.spec.calibrate import PassCosts, measure_pass_costs
from specdec.spec.control.base import Controller
from specdec.spec.control.memory import ControllerMemory
from specdec.spec.proposers.base import Proposal, Proposer
from specdec.spec.verify import TorchRandom, tree_attention_mask, tree_depths
from specdec.stats import GenerationStats, StepRecord


class Engine:
    def __init__(self, target: Runner, tokenizer: TextTokenizer, proposer: Proposer | None = None,
                 method: str = "none", eos_ids: tuple[int, ...] = (), max_draft_tokens: int = 8,
                 fixed_draft_tokens: int | None = None, typical_acceptance: bool = False, exact: bool = True,
                 memory: ControllerMemory | None = None, memory_setup: str = "", reuse_prefix: bool = True):
        self.target = target
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.method = method
        self.eos_ids = frozenset(eos_ids)
        self.max_draft_tokens = max_draft_tokens
        self.fixed_draft_tokens = fixed_draft_tokens
        self.typical_acceptance = typical_acceptance  # LOSSY tree acceptance, off by default
        # batch-invariant passes for greedy and seeded drafter-invariant sampling: each row of a
        # verify pass gives the logits a 1-token pass would, so the speculative output equals
        # plain decoding's bit for bit in any dtype
        self.exact = exact
        self.pass_costs: PassCosts | None = None  # from calibrate(): the controllers' starting costs
        self._grammars: GrammarCompiler | None = None  # built on the first constrained request
        # prefix reuse: a new prompt's leading tokens that the target cache already holds are
        # not computed again (an editor's requests share most of their text). Only where every
        # cached row has the bits a fresh prefill would write (Runner.kv_rows_invariant), so the
        # output never depends on earlier requests
        self.reuse_prefix = reuse_prefix
        self._held: list[int] | None = None  # context whose all-but-last tokens the cache holds
        # controllers start from what earlier processes learned with this setup (memory_setup:
        # target, drafter, dtype, kernels) on this machine, and leave what they learn there
        self.memory = memory if proposer is not None and fixed_draft_tokens is None else None
        self.controllers = ControllerBank(self.new_controller, self.memory, memory_setup)

    def calibrate(self) -> PassCosts:
        """Time (and so warm up) the passes decoding will use; new controllers start from them."""
        filler = min(self.eos_ids) if self.eos_ids else 0
        tree = self.proposer is not None and self.proposer.shape == "tree"
        # plain decoding only ever runs 1-token passes
        max_k = 0 if self.proposer is None else max(self.proposer.tree_sizes) if tree else self.max_draft_tokens
        self._held = None
        self.pass_costs = measure_pass_costs(self.target, self.proposer, max_k, filler, exact=self.exact)
        self.controllers.clear()
        return self.pass_costs

    @property
    def context_window(self) -> int:
        return self.target.max_len

    @property
    def needs_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden

    def memory_bytes(self) -> int:
        """Weights and caches of the target and the drafter."""
        return self.target.memory_bytes() + (self.proposer.memory_bytes() if self.proposer is not None else 0)

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            if not self.eos_ids:
                raise SpecdecError("the prompt is empty")
            ids = [min(self.eos_ids)]  # start of a fresh document
        if len(ids) >= self.context_window:
            raise SpecdecError(f"the prompt has {len(ids)} tokens; the model's context window is "
                               f"{self.context_window} tokens (room is needed for at least one new token)")
        return ids

    def controller_for(self, params: SamplingParams) -> Controller:
        """This engine's controller for a sampling setting (engine/controllers.py)."""
        return self.controllers.get(params)

    def remember(self, seq: Sequence) -> None:
        """Leave what seq's controller learned for later processes (engine/controllers.py)."""
        self.controllers.remember(seq.params, seq.controller)

    def new_controller(self, tree: bool | None = None) -> Controller:
        """A controller for this engine's drafter (tree: for a tree drafter or not, whatever
        this engine's is: a batch mixes methods)."""
        if tree is None:
            tree = self.proposer is not None and self.proposer.shape == "tree"
        return new_controller(self.proposer.tree_sizes if tree else None, self.max_draft_tokens,
                              self.fixed_draft_tokens, self.pass_costs)

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles grammars for this tokenizer (built on first use)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.target.vocab_size, self.eos_ids)
        return self._grammars

    def grammar_state(self, params: SamplingParams) -> GrammarState | None:
        return self.grammars.state(params.grammar) if params.grammar is not None else None

    # ---------------------------------------------------------------- one generation
    def new_sequence(self, prompt: str | list[int], params: SamplingParams, controller: Controller | None = None,
                     method: str | None = None) -> Sequence:
        """A generation's state before any pass (shared with the batched engine)."""
        prompt_ids = self.encode_prompt(prompt)
        generator = make_generator(params.seed)
        controller = controller or self.controller_for(params)
        controller.start_sequence()
        seq = Sequence(prompt_ids, params, controller, generator, TorchRandom(generator),
                       TextStream(self.tokenizer, params.stop),
                       GenerationStats(method or self.method, lossy=self.typical_acceptance and not params.greedy),
                       time.perf_counter(), context=list(prompt_ids), generated=[],
                       history=history_for(params, prompt_ids, self.target.vocab_size, self.grammar_state(params)),
                       token_logprobs=[] if params.logprobs is not None else None,
                       noise=PositionNoise(params.seed, self.target.vocab_size) if params.drafter_invariant else None)
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]  # the first token has no distribution
        return seq

    def start(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        """Prefill the prompt (all but its last token) after the cached prefix it shares with
        the previous generation, if any (see reuse_prefix), else from an empty cache."""
        seq = self.new_sequence(prompt, params)
        prompt_ids, started_at = seq.prompt_ids, seq.started_at
        reused = self._reusable_prefix(prompt_ids, params)
        self._held = None
        self.target.rollback(reused)
        if self.proposer is not None:
            self.proposer.reset(prompt_ids)
        if len(prompt_ids) - 1 > reused:
            logits = self.target.extend(prompt_ids[reused:-1], want_hidden=self.needs_hidden,
                                        exact=self.exact_prefill(seq),
                                        want_logits=params.prompt_logprobs is not None)
            if params.prompt_logprobs is not None:
                seq.prompt_logprobs += token_logprobs(logits, prompt_ids[1:], params.prompt_logprobs)
            if self.needs_hidden:
                self.proposer.observe_target(self.target.last_hidden, prefill=True)
        seq.stats.cached_prompt_tokens = reused
        seq.stats.prefill_seconds = time.perf_counter() - started_at
        self._held = seq.context
        return seq

    def _reusable_prefix(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """How many leading prompt tokens the target cache holds already and may keep."""
        held = self._held
        if (not self.reuse_prefix or held is None or params.prompt_logprobs is not None or self.needs_hidden
                or not getattr(self.target, "kv_rows_invariant", False) or self.target.length != len(held) - 1):
            return 0
        return shared_prefix(held, prompt_ids, min(len(held), len(prompt_ids)) - 1)

    def step(self, seq: Sequence) -> StepRecord:
        """One decode step: choose K, draft, verify in one target pass, emit the kept tokens.
        Sets seq.finish_reason when the generation is over."""
        self._held = None  # a step that fails midway leaves the cache unknown
        record = self._step(seq)
        self._held = seq.context
        return record

    def _step(self, seq: Sequence) -> StepRecord:
        t0 = time.perf_counter()
        room = self.target.max_len - len(seq.context)  # cache room left after the fed tokens
        budget = self._choose_budget(seq, room)
        proposal = (self.proposer.propose(seq.context, budget, seq.params, seq.generator, history=seq.history,
                                          noise=seq.noise)
                    if budget > 0 else Proposal([]))
        t1 = time.perf_counter()
        verify = self._verify_chain if proposal.parents is None else self._verify_tree
        verified = verify(seq, proposal)
        if self.needs_hidden:
            self.proposer.observe_target(self.target.last_hidden[verified.kept])
        kept_logits = verified.logits[verified.kept] if seq.token_logprobs is not None else None
        return self.emit(seq, verified.new_tokens, kept_logits, budget, proposal, verified.num_accepted,
                         draft_seconds=t1 - t0, target_seconds=verified.target_seconds,
                         other_since=t1 + verified.target_seconds, observe=self.proposer is not None)

    def emit(self, seq: Sequence, tokens: list[int], logits: torch.Tensor | None, budget: int, proposal: Proposal,
             accepted: int, draft_seconds: float, target_seconds: float, other_since: float,
             observe: bool) -> StepRecord:
        """Append a step's verified tokens (accepted drafts + the target's own) to seq, apply its
        stop rules and record the step; logits[j] is the pass row that predicted tokens[j]
        (needed for logprobs only). Shared by step() and the batched engine."""
        new, hit_eos = seq.cut(tokens, self.eos_ids)
        seq.context.extend(new)
        seq.generated.extend(new)
        if seq.history is not None:
            seq.history.extend(new)
        if seq.token_logprobs is not None:
            seq.token_logprobs += token_logprobs(logits, new, seq.params.logprobs)
        text = seq.text.push(new)
        stopped = hit_eos or seq.text.stopped
        step = StepRecord(budget=budget, drafted=len(proposal.tokens), accepted=accepted, new_tokens=tuple(new),
                          text=text, draft_seconds=draft_seconds - proposal.sync_seconds,
                          sync_seconds=proposal.sync_seconds, target_seconds=target_seconds,
                          other_seconds=time.perf_counter() - other_since, stopped=stopped)
        if observe:
            seq.controller.observe(step)
        seq.stats.add(step)
        if stopped:
            seq.finish_reason = "stop"
        elif (seq.remaining <= 0 or self.target.max_len - len(seq.context) <= 0
              or seq.past_line_time_limit()):
            seq.finish_reason = "length"
        return step

    def finish(self, seq: Sequence) -> tuple[GenerationResult, str]:
        """The result, and the text held back until now (Sequence.finish)."""
        return seq.finish()

    def _choose_budget(self, seq: Sequence, room: int) -> int:
        if self.proposer is None or (self.needs_hidden and self.target.length == 0):
            return 0  # no drafter, or a feature drafter before any target features exist
        if self.proposer.shape == "tree":
            return seq.controller.choose(room - 1)
        return seq.controller.choose(min(seq.remaining - 1, room - 1))

    def exact_for(self, seq: Sequence) -> bool:
        """Whether seq's target passes use the exact (batch-invariant) kernels."""
        return self.exact and (seq.params.greedy or seq.noise is not None)

    def exact_prefill(self, seq: Sequence) -> bool:
        """Exact prompt passes where free: prompt rows then never depend on a timing at load."""
        return self.exact_for(seq) and self.target.exact_is_free

    def _target_pass(self, ids: list[int], seq: Sequence, **kwargs) -> tuple[torch.Tensor, float]:
        """Exact (batch-invariant) kernels where the output is a deterministic function of the
        target's rows (greedy, seeded races); rejection sampling is lossless in distribution
        either way, so it keeps the fastest kernels."""
        t0 = time.perf_counter()
        logits = self.target.extend(ids, want_hidden=self.needs_hidden, exact=self.exact_for(seq), **kwargs)
        return logits, time.perf_counter() - t0

    def _verify_chain(self, seq: Sequence, proposal: Proposal) -> Verified:
        """Score [last] + drafts in one pass; keep the accepted prefix in the cache."""
        drafts, start = proposal.tokens, self.target.length
        logits, seconds = self._target_pass([seq.context[-1]] + drafts, seq)
        verdict = chain_verdict(seq, proposal, logits)
        n = verdict.num_accepted
        self.target.rollback(start + 1 + n)
        return Verified(drafts[:n] + [verdict.next_token], n, list(range(n + 1)), seconds, logits)

    def _verify_tree(self, seq: Sequence, proposal: Proposal) -> Verified:
        """Score [last] + tree nodes in one pass with a tree mask; keep only the accepted path."""
        drafts, parents, start = proposal.tokens, proposal.parents, self.target.length
        logits, seconds = self._target_pass([seq.context[-1]] + drafts, seq,
                                            attn_mask=tree_attention_mask(parents),
                                            positions=start + torch.tensor([0] + tree_depths(parents)))
        verdict = tree_verdict(seq, proposal, logits, self.typical_acceptance)
        kept = [0] + [1 + i for i in verdict.path]
        self.target.keep(start, kept)
        return Verified([drafts[i] for i in verdict.path] + [verdict.next_token], len(verdict.path), kept, seconds,
                        logits)

    # ---------------------------------------------------------------- the loop
    def generate(self, prompt: str | list[int], params: SamplingParams) -> GenerationResult:
        result = None
        for chunk in self.stream(prompt, params):
            result = chunk.result
        return result

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[StreamChunk]:
        """A chunk per step; the last chunk carries the result (and, when EOS or a stop string
        ended the generation, that step's tokens)."""
        seq = self.start(prompt, params)
        last_step = None
        prompt_logprobs = seq.prompt_logprobs  # handed out with the first chunk
        while seq.finish_reason is None:
            step = self.step(seq)
            if step.stopped:
                last_step = step
                break
            yield StreamChunk(step.text, list(step.new_tokens), step=step, prompt_logprobs=prompt_logprobs,
                              token_logprobs=last_entries(seq.token_logprobs, len(step.new_tokens)))
            prompt_logprobs = None
        result, tail = self.finish(seq)
        self.remember(seq)
        tokens = list(last_step.new_tokens) if last_step is not None else []
        yield StreamChunk((last_step.text if last_step is not None else "") + tail, tokens, result, step=last_step,
                          token_logprobs=last_entries(seq.token_logprobs, len(tokens)), prompt_logprobs=prompt_logprobs)
