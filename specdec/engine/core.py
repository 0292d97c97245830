"""What every generation of a decoder shares: the target runner, the tokenizer, the drafter,
the controllers (per sampling setting, remembered across processes), the pass costs they start
from, and the parts of a generation outside the loop: a new Sequence from a prompt, and
`emit`, which appends a step's verified tokens and applies the stop rules. The loop itself, for
one request or many, is engine/scheduler.py."""
from __future__ import annotations

import time

import torch

from specdec.engine.controllers import ControllerBank, new_controller
from specdec.engine.sequence import GenerationResult, Sequence
from specdec.engine.text import TextStream, TextTokenizer
from specdec.errors import SpecdecError
from specdec.models.runner import Runner
from specdec.sampling import SamplingParams, make_generator
from specdec.sampling.grammar import GrammarCompiler, GrammarState
from specdec.sampling.logprobs import token_logprobs
from specdec.sampling.penalties import history_for
from specdec.sampling.seeded import PositionNoise
from specdec.spec.calibrate import PassCosts, measure_pass_costs
from specdec.spec.control.base import Controller
from specdec.spec.control.memory import ControllerMemory
from specdec.spec.proposers.base import Proposal, Proposer
from specdec.spec.verify import TorchRandom
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
        # prefix reuse: a new prompt's leading tokens that a slot's cache already holds are not
        # computed again (engine/scheduler.py Scheduler._reusable_prefix)
        self.reuse_prefix = reuse_prefix
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
        self.pass_costs = measure_pass_costs(self.target, self.proposer, max_k, filler, exact=self.exact)
        if self.pass_costs.draft_pass_seconds:  # a draft model's guesses sized by its pass widths' costs
            self.proposer.guesser.pass_seconds = self.pass_costs.draft_pass_seconds
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
        this engine's is: a batch mixes methods). The engine's own (tree None: a lone
        sequence's, ControllerBank) lets a drafter that stops_at_floor size its chains by its
        confidence; a batch's draft model drafts in batched passes, which run to their K."""
        own = tree is None
        if tree is None:
            tree = self.proposer is not None and self.proposer.shape == "tree"
        stops = own and not tree and getattr(self.proposer, "stops_at_floor", False)
        return new_controller(self.proposer.tree_sizes if tree else None, self.max_draft_tokens,
                              self.fixed_draft_tokens, self.pass_costs, stops)

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles grammars for this tokenizer (built on first use)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.target.vocab_size, self.eos_ids)
        return self._grammars

    def grammar_state(self, params: SamplingParams) -> GrammarState | None:
        return self.grammars.state(params.grammar) if params.grammar is not None else None

    # ---------------------------------------------------------------- a generation's parts
    def new_sequence(self, prompt: str | list[int], params: SamplingParams, controller: Controller | None = None,
                     method: str | None = None) -> Sequence:
        """A generation's state before any pass."""
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

    def emit(self, seq: Sequence, tokens: list[int], logits: torch.Tensor | None, budget: int, proposal: Proposal,
             accepted: int, draft_seconds: float, target_seconds: float, other_since: float,
             observe: bool) -> StepRecord:
        """Append a step's verified tokens (accepted drafts + the target's own) to seq, apply its
        stop rules and record the step; logits[j] is the pass row that predicted tokens[j]
        (needed for logprobs only)."""
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
                          other_seconds=time.perf_counter() - other_since, stopped=stopped,
                          confidences=tuple(proposal.confidences or ()))
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

    def exact_for(self, seq: Sequence) -> bool:
        """Whether seq's target passes use the exact (batch-invariant) kernels."""
        return self.exact and (seq.params.greedy or seq.noise is not None)

    def exact_prefill(self, seq: Sequence) -> bool:
        """Exact prompt passes where free: prompt rows then never depend on a timing at load."""
        return self.exact_for(seq) and self.target.exact_is_free
