"""Pass costs measured at load time, so that the first generation of a fresh process neither
pays the first-call costs of each pass shape (kernel selection, buffer allocation) inside its
own timings nor lets the draft-length controller start from guesses: a one-shot CLI call at
T=1 must not be slower than plain decoding because the controller spent its first steps
probing a cold process."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.models.batch import BatchRunner
from specdec.models.cache import PassPlan
from specdec.models.runner import Runner
from specdec.sampling import SamplingParams, make_generator
from specdec.spec.control.batch_width import BatchDraftLength
from specdec.spec.proposers.base import Proposer
from specdec.spec.proposers.batch_draft import BatchDraftModel
from specdec.spec.verify import tree_attention_mask

WARM_PROMPT = 8  # dummy context length; decoding costs barely depend on it at these sizes
READ_CALIBRATION = 128  # tokens a draft model reads to time its reading of a prompt


@dataclass
class PassCosts:
    target_seconds: dict[int, float] = field(default_factory=dict)  # K drafted -> pass over K+1 tokens
    draft_seconds_per_token: float | None = None  # chain drafters that run a model
    draft_pass_seconds: dict[int, float] = field(default_factory=dict)  # a draft model's pass by width (Guesser)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@torch.inference_mode()
def measure_pass_costs(target: Runner, proposer: Proposer | None, max_k: int, filler_token: int,
                       repeats: int = 3, exact: bool = False) -> PassCosts:
    """Best of `repeats` timings of a target pass over K+1 tokens for K = 0 and the powers of
    two up to max_k (the controller fits a line through them), after one warm-up pass each;
    for a draft model, its cost per drafted token. Every other pass width decoding may use is
    run once untimed, also with the exact kernels if exact: a kernel library builds its kernel
    for a new matrix shape on first use (measured here: ~0.3 ms per projection shape, 1.5 ms
    per new width on the bundled target), which a one-shot call would otherwise pay inside
    its generation. Leaves both caches empty."""
    costs = PassCosts()
    context = [filler_token] * WARM_PROMPT
    tree = proposer is not None and proposer.shape == "tree"
    want_hidden = proposer is not None and proposer.needs_hidden
    target.reset()
    target.extend(context[:-1], want_hidden=want_hidden, want_logits=False)
    start = target.length
    sizes = sorted({0, *(k for k in (1, 2, 4, 8, 16) if k <= max_k), max_k})
    def one_pass(k: int, use_exact: bool = False) -> None:
        """A pass over K+1 tokens; trees verify with a mask, chains without: the path decoding takes."""
        mask = tree_attention_mask(list(range(-1, k - 1))) if tree and k > 0 else None
        target.extend([filler_token] * (k + 1), attn_mask=mask, want_hidden=want_hidden, exact=use_exact)
        target.rollback(start)

    for k in sizes:
        one_pass(k)
        costs.target_seconds[k] = min(_timed(lambda k=k: one_pass(k)) for _ in range(repeats))
    widths = set(proposer.tree_sizes) if tree else set(range(1, max_k + 1))  # trees use a few sizes
    for k in sorted({0} | widths):
        for use_exact in ([False, True] if exact else [False]):
            if use_exact or k not in costs.target_seconds:  # the rest ran above
                one_pass(k, use_exact)
    target.reset()
    if proposer is not None and proposer.shape == "chain":
        greedy, generator, k = SamplingParams(), make_generator(0), min(4, max_k)

        def draft() -> tuple[list[int], float]:
            """The drafts and the seconds they took, without the context's read before them: a
            step's catch-up is timed apart (sync_seconds) and the controller's draft cost leaves it
            out, so it must here too. Without prefix reuse each timed draft reads the context again
            (the Qwen pair's 0.5B draft then measured 18 ms a draft against 10-13 in its steps, on
            Zen 3, and the controller decoded whole answers plainly)."""
            proposer.reset(context)
            t0 = time.perf_counter()
            proposal = proposer.propose(context, k, greedy, generator)
            return proposal.tokens, time.perf_counter() - t0 - proposal.sync_seconds

        # a pass a draft: the filler's repeats would let a draft model's prompt-lookup guesses
        # (prompt_lookup.Guesser) draft several tokens a pass, which real text does less often
        ahead = getattr(proposer, "ahead", False)
        if ahead:
            proposer.ahead = False
        drafted, _ = draft()
        costs.draft_seconds_per_token = min(draft()[1] for _ in range(repeats)) / k
        if drafted:  # a step that accepted every draft leaves a draft model two tokens to catch up
            # on: a pass width of its own (with --compile a graph of its own, ~5 s to compile)
            other = filler_token if drafted[0] != filler_token else filler_token + 1
            proposer.propose(context + [other, other], k, greedy, generator)
        guesser = getattr(proposer, "guesser", None)
        if guesser is not None:  # a pass with guesses: its widths, which size the guesses (Guesser.worth)
            costs.draft_pass_seconds = draft_pass_costs(proposer.runner, context, guesser.tokens + 1, repeats)
            proposer.reset([])  # its cache was emptied under it
        if hasattr(proposer, "upfront_seconds"):  # a lazily read prompt: time the draft's reading rate
            proposer.reset([])
            long_context = [filler_token] * min(READ_CALIBRATION, proposer.runner.max_len - k - 1)
            proposer.propose(long_context, 1, greedy, generator)
        proposer.reset([filler_token])
        if ahead:
            proposer.ahead = True
    return costs


def draft_pass_costs(runner: Runner, context: list[int], max_width: int, repeats: int) -> dict[int, float]:
    """Best of `repeats` timings of a draft model's pass over 1 .. max_width tokens after
    `context`, each row's logits wanted (as a pass with guesses wants them). Leaves the cache empty."""
    runner.reset()
    runner.extend(context, want_logits=False)
    start, seconds = runner.length, {}

    def one_pass(width: int) -> None:
        runner.extend(context[-1:] * width, last_logits=width == 1)
        runner.rollback(start)

    for width in range(1, max_width + 1):
        one_pass(width)
        seconds[width] = min(_timed(lambda w=width: one_pass(w)) for _ in range(repeats))
    runner.reset()
    return seconds


def measure_batch_costs(runner: BatchRunner, draft: BatchDraftModel | None, width: BatchDraftLength, max_batch: int,
                        max_rows: int, exact: bool, filler: int, context: int = WARM_PROMPT, repeats: int = 2) -> None:
    """Time (and warm up) batched target passes over 1, 2, 4, ... max_rows rows (n sequences
    of `context` filler tokens, n * width = rows) and, with a draft model, batched draft passes
    over 1, 2, 4, ... sequences, into width's cost tables (a batch's K starts from them).
    runner's slots (and draft's) must be empty; they are empty again after."""
    prefix = [filler] * context
    for slot in range(max_batch):
        runner.extend_slot(slot, prefix, want_logits=False)
        if draft is not None:
            draft.prefill(slot, prefix)

    def best(fn, *args) -> float:
        fn(*args)  # warm-up
        return min(_timed(lambda: fn(*args)) for _ in range(repeats))

    def target_pass(n: int, width: int) -> None:
        runner.forward(PassPlan([[filler] * width] * n, [exact] * n))
        for slot in range(n):
            runner.rollback(slot, context)

    def draft_pass(n: int) -> None:
        draft.runner.forward(PassPlan([[filler]] * n, want_hidden=False))
        for slot in range(n):
            draft.runner.rollback(slot, context)

    rows = 1
    while rows <= max_rows:
        n = min(max_batch, rows)
        width.target.observe(n * (rows // n), best(target_pass, n, rows // n))
        if draft is not None and rows <= max_batch:
            width.draft.observe(rows, best(draft_pass, rows))
        rows *= 2
    for slot in range(max_batch):
        runner.rollback(slot, 0)
        if draft is not None:
            draft.reset(slot)
