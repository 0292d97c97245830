"""Python API: `specdec.load(...)` returns a SpecDecoder with generate() and stream()."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path

from specdec.chat.fim import FimPrompt, FimTokens, fim_prompt, find_fim_tokens, require_fim_tokens
from specdec.engine.config import DecoderConfig
from specdec.engine.core import Engine
from specdec.engine.loading import (
    cut_draft_head,
    default_exact,
    draft_in_4bit,
    eos_token_ids,
    head_proposer,
    load_runner,
    model_identity,
)
from specdec.engine.requests import generate_all, generate_one, stream
from specdec.engine.scheduler import Scheduler
from specdec.engine.sequence import GenerationResult, StreamChunk
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.models.bundled import DEFAULT_TARGET, default_draft_vocab, default_head, default_quantize
from specdec.models.gguf import release_readers
from specdec.models.heap import loading_heap, settle_objects
from specdec.sampling import SamplingParams
from specdec.sampling.grammar import Grammar, grammar_from_response_format
from specdec.spec.control.memory import ControllerMemory, default_path
from specdec.spec.proposers import DraftModelProposer, PromptLookupProposer
from specdec.spec.proposers.cross_vocab import cross_vocab_proposer
from specdec.spec.proposers.vocab_map import same_tokenizer


class SpecDecoder:
    def __init__(self, engine: Engine, target_path: Path, draft_path: Path | None):
        self.engine = engine
        self.target_path = target_path
        self.draft_path = draft_path
        self.tokenizer = engine.tokenizer
        self._alone = Scheduler(engine, max_batch=1)  # lone requests: the decoder's own runner and cache
        self._batch: Scheduler | None = None

    @property
    def method(self) -> str:
        return self.engine.method

    @property
    def exact(self) -> bool:
        """Batch-invariant target passes (see specdec.load)."""
        return self.engine.exact

    @property
    def speculative(self) -> bool:
        return self.engine.method != "none"

    @property
    def vocab_size(self) -> int:
        return self.engine.target.vocab_size

    @property
    def context_window(self) -> int:
        return self.engine.context_window

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a generation (for chat models, the end-of-turn token among them)."""
        return tuple(sorted(self.engine.eos_ids))

    @property
    def max_draft_tokens(self) -> int:
        """Largest number of drafted tokens (tree nodes for tree methods) one step may verify."""
        return self.engine.max_draft_tokens if self.speculative else 0

    def check_grammar(self, grammar: Grammar) -> None:
        """Compile the grammar for this tokenizer now (cached): a bad one is a SpecdecError here,
        not in the middle of a generation."""
        self.engine.grammars.check(grammar)

    def memory_bytes(self) -> int:
        """Bytes held by the target and draft models (weights and KV caches)."""
        return self.engine.memory_bytes()

    @staticmethod
    def sampling_params(**sampling) -> SamplingParams:
        """SamplingParams from keyword arguments; `response_format` (OpenAI's shape, see
        grammar.grammar_from_response_format) is another way to give `grammar`."""
        if "response_format" in sampling:
            grammar = grammar_from_response_format(sampling.pop("response_format"))
            if grammar is not None and sampling.get("grammar") is not None:
                raise SpecdecError("give either response_format or grammar, not both")
            sampling.setdefault("grammar", grammar)
        if "stop" in sampling:
            stop = sampling["stop"]
            sampling["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        try:
            return SamplingParams(**sampling)
        except TypeError as e:
            raise SpecdecError(f"unknown sampling parameter: {e}") from None

    def generate(self, prompt: str | list[int], **sampling) -> GenerationResult:
        return generate_one(self.scheduler(1), prompt, self.sampling_params(**sampling))

    def fim_tokens(self) -> FimTokens | None:
        """The target's fill-in-the-middle tokens, or None when its vocabulary has none."""
        return find_fim_tokens(self.tokenizer)

    def fim_prompt(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (), typed: str = "",
                   max_new_tokens: int = 128) -> FimPrompt:
        """The fill-in-the-middle prompt for the gap between prefix and suffix (fim.fim_prompt),
        cut to leave max_new_tokens of the context window; a clear error for a model without FIM."""
        fim = require_fim_tokens(self.tokenizer, f"model {str(self.target_path)!r}")
        return fim_prompt(self.tokenizer, fim, prefix, suffix, extra, typed,
                          budget=self.context_window - max_new_tokens)

    def infill(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (), typed: str = "",
               **sampling) -> GenerationResult:
        """The middle between prefix and suffix (code completion at a cursor): generate() on the
        FIM prompt, ended also by the model's FIM pad and separator tokens. With ngram the
        suffix is in the prompt, so lookups find what follows the gap."""
        prompt = self.fim_prompt(prefix, suffix, extra, typed, sampling.get("max_new_tokens", 128))
        sampling["stop_token_ids"] = (*sampling.get("stop_token_ids", ()), *prompt.stop_token_ids)
        return self.generate(prompt.ids, **sampling)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               **sampling) -> Iterator[StreamChunk]:
        """Decode step by step; `params` (built, e.g. by the server's validation) or keyword arguments."""
        if params is not None and sampling:
            raise SpecdecError("give either params or sampling keyword arguments, not both")
        params = params if params is not None else self.sampling_params(**sampling)
        self.engine.encode_prompt(prompt)  # fail before the first chunk
        return stream(self.scheduler(1), prompt, params)

    def scheduler(self, max_batch: int = 8) -> Scheduler:
        """The loop over this decoder's target for up to max_batch sequences: for one, on the
        decoder's own runner and cache (what generate() and stream() use); for more, a batched
        cache of max_batch slots (kept for the next call with the same max_batch), calibrated
        when the decoder was."""
        if max_batch == 1:
            return self._alone
        if self._batch is None or self._batch.max_batch != max_batch:
            self._batch = None  # free the old cache first
            self._batch = Scheduler(self.engine, max_batch, calibrate=self.engine.pass_costs is not None)
        return self._batch

    def generate_batch(self, prompts: list[str | list[int]], samplings: list[dict] | None = None,
                       max_batch: int = 8, **sampling) -> list[GenerationResult]:
        """Generate for many prompts at once, up to max_batch sharing each target pass
        (continuous batching: a waiting prompt joins as soon as a slot frees). `sampling`
        applies to every prompt; samplings[i] (optional) adds prompt i's own settings, and may
        name its `method` among the batched ones (none, ngram; default: the decoder's own when
        batched, else none). Results in prompt order; each is what generate() would give
        (greedy: the same tokens; seeded: the same tokens in the default seed mode)."""
        if samplings is not None and len(samplings) != len(prompts):
            raise SpecdecError(f"samplings has {len(samplings)} entries for {len(prompts)} prompts")
        requests = []
        for i, prompt in enumerate(prompts):
            own = dict(samplings[i]) if samplings is not None else {}
            method = own.pop("method", None)
            requests.append((prompt, self.sampling_params(**{**sampling, **own}), method))
        return generate_all(self.scheduler(max_batch), requests)


def load(target: str | Path | None = None, draft: str | Path | None = None, **options) -> SpecDecoder:
    """Load a decoder: the target (None = the bundled model), its draft model or head, and what
    DecoderConfig's other fields (keyword arguments here) ask for. Then every object alive is set
    aside from Python's cyclic collector (gc.freeze: models/heap.settle_objects), so that no full
    collection stalls decoding."""
    known = {f.name for f in fields(DecoderConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SpecdecError(f"load() got unknown option(s) {', '.join(map(repr, unknown))}; the options are "
                           f"DecoderConfig's fields: {', '.join(sorted(known))}")
    return load_config(DecoderConfig(target=target, draft=draft, **options))


def load_config(config: DecoderConfig) -> SpecDecoder:
    """The decoder DecoderConfig describes (checked first: a clear error for each bad field)."""
    config.check()
    with loading_heap():  # the pair's peak memory was its load's, ~100 MB above decoding's
        decoder = _load(config)
    settle_objects()  # no full collection's ~130 ms stall while decoding
    return decoder


def _load(config: DecoderConfig) -> SpecDecoder:
    c = config
    target_path = Path(c.target) if c.target is not None else DEFAULT_TARGET
    quantize = c.quantize if c.quantize is not None else default_quantize(c.target)
    target_runner = load_runner(target_path, c.dtype, c.backend, c.max_len, quantize, c.group_size, c.pack,
                                c.compile)
    tokenizer = TextTokenizer(target_path)
    target_eos = eos_token_ids(target_path)
    release_readers()  # the target's GGUF header is no longer needed (~20 MB for a 152k vocabulary)
    draft_path = None
    proposer = None
    draft_vocab = 0
    if c.method == "draft":
        draft_path = Path(c.draft) if c.draft is not None else default_head(c.target, "draft")
        if draft_path is None:
            raise SpecdecError("method 'draft' needs a draft model (--draft DIR): none is shipped for "
                               "this target")
        draft_tokenizer = TextTokenizer(draft_path)
        draft_vocab = c.draft_vocab if c.draft_vocab is not None else default_draft_vocab(draft_path)
        same_vocabulary = same_tokenizer(draft_tokenizer.tok, tokenizer.tok)
        # rounded as each tensor is read: the draft's byte-a-value form never held whole (peak memory)
        four_bit = same_vocabulary and draft_in_4bit(c.draft_4bit, quantize)
        draft_runner = load_runner(draft_path, c.dtype, c.backend, target_runner.max_len, quantize, c.group_size,
                                   c.pack, c.compile, four_bit)
        release_readers()
        if not same_vocabulary:  # another vocabulary: proposers/cross_vocab.py
            lookup = c.tree_lookup is not False and target_runner.supports_tree
            proposer = cross_vocab_proposer(draft_runner, draft_tokenizer.tok, tokenizer.tok,
                                            target_runner.vocab_size, c.cross_vocab, lookup)
        elif draft_runner.vocab_size != target_runner.vocab_size:
            raise SpecdecError(f"draft vocabulary size {draft_runner.vocab_size} differs from the "
                               f"target's {target_runner.vocab_size} although their tokenizers are the same")
        else:
            cut_draft_head(draft_runner, draft_tokenizer.tok, draft_vocab)
            lookup = bool(c.tree_lookup) and target_runner.supports_tree
            proposer = DraftModelProposer(draft_runner, c.reuse_prefix, lookup)
    elif c.method == "ngram":
        proposer = PromptLookupProposer()
    elif c.method in ("medusa", "eagle"):
        if not target_runner.supports_tree:
            raise SpecdecError(f"method {c.method!r} needs the native runtime (llama, mistral, qwen2)")
        draft_path = Path(c.draft) if c.draft is not None else default_head(c.target, c.method)
        if draft_path is None:
            raise SpecdecError(f"method {c.method!r} needs a {c.method} head folder (--draft DIR): none is "
                               "shipped for this target")
        proposer = head_proposer(c.method, draft_path, target_runner, c.tree_nodes, c.pack, c.tree_lookup is not False,
                                 c.draft_4bit)
    elif c.draft is not None:
        raise SpecdecError(f"a draft model was given but method is {c.method!r}; use method 'draft'")
    exact = c.exact if c.exact is not None else default_exact(c.dtype, c.compile)
    memory_path = default_path() if c.memory is True else Path(c.memory) if c.memory else None
    # the setup a controller's learned acceptance and costs belong to (plus machine and sampling)
    setup = (f"{model_identity(target_path)}|{c.method}|{model_identity(draft_path)}|{c.dtype}|{c.backend}|"
             f"exact={exact}|{quantize}/{c.group_size}|pack={c.pack}|compile={c.compile}|{c.cross_vocab}|"
             f"nodes={c.tree_nodes}|max_k={c.max_draft_tokens}|draft_vocab={draft_vocab}"
             + ("|4bit_head" if getattr(getattr(proposer, "head", None), "four_bit", False) else "")
             + (f"|lookup={getattr(proposer, 'lookup', None) is not None}" if c.method in ("eagle", "draft") else ""))
    engine = Engine(target_runner, tokenizer, proposer, c.method, target_eos,
                    max_draft_tokens=c.draft_tokens or c.max_draft_tokens, fixed_draft_tokens=c.draft_tokens,
                    typical_acceptance=c.typical_acceptance, exact=exact,
                    memory=ControllerMemory(memory_path) if memory_path is not None else None, memory_setup=setup,
                    reuse_prefix=c.reuse_prefix)
    if c.calibrate:
        engine.calibrate()
    return SpecDecoder(engine, target_path, draft_path)
