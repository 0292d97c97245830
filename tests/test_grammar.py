"""Structured output. Exact proofs by enumeration (float64, a toy grammar on 3 and 5 tokens):
one speculative step, chain or tree, sampled or deterministic drafts (including drafts that
leave the grammar), with the grammar walked along every row's path through one TokenHistory
as the engine does, gives exactly the constrained target's joint; power checks show that
masks ignoring the drafts are caught. Then the grammar state (walk, rollback, cut), and
llguidance end to end: greedy identity of every method with the grammar, output that parses."""
import itertools
import json
import re

import pytest
import torch
from test_tree_verify import completions, node_prefix
from test_verify_exact import assert_same

import specdec
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, final_probs
from specdec.sampling.grammar import Grammar, GrammarState, grammar_from_response_format
from specdec.sampling.penalties import TokenHistory, chain_paths, tree_paths
from specdec.spec.verify import verify_greedy, verify_rejection, verify_tree_sampling

from enumerate import RandomLM, enumerate_outcomes
from helpers import SAMPLE_TEXT, make_eagle_dir, make_medusa_dir, make_model_dir
from toy_grammar import ConstrainedLM, ToyMatcher

V = 3
PROMPT, GENERATED = (0, 1), (2,)  # after 2: tokens 0 and 1 are allowed
SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=2),
    dict(temperature=1.0, presence_penalty=0.8, repetition_penalty=1.5, logit_bias={0: 0.4}),
]


def history_with_grammar(params: SamplingParams, vocab_size: int) -> TokenHistory:
    history = TokenHistory(params, list(PROMPT), vocab_size, GrammarState(ToyMatcher(vocab_size), vocab_size))
    history.extend(list(GENERATED))
    return history


def joint(lm, prefix: tuple, n: int, vocab_size: int = V) -> dict:
    out = {}
    for seq in itertools.product(range(vocab_size), repeat=n):
        prob, ctx = 1.0, prefix
        for t in seq:
            prob *= float(lm(ctx)[t])
            ctx = ctx + (t,)
        if prob > 0:
            out[seq] = prob
    return out


def constrained_step(target: RandomLM, draft, params: SamplingParams, k: int, paths=chain_paths) -> dict:
    """Distribution of the next k+1 tokens: one speculative step (every row from ONE history
    with the grammar, a path per row, as the engine and the draft model build them), then
    plain sampling from the constrained target. draft: a RandomLM (sampled, constrained like
    the target) or a function ctx -> deterministic tokens (point masses, like prompt lookup)."""
    ctx = PROMPT + GENERATED
    history = history_with_grammar(params, V)
    want = ConstrainedLM(target, params, PROMPT, V)

    def rows(lm: RandomLM, seq: tuple, n: int) -> torch.Tensor:
        logits = torch.stack([lm(ctx + seq[:i]).log() for i in range(n)])
        return final_probs(logits, params, history.rows(paths(list(seq))[:n]))

    draft_seqs = list(itertools.product(range(V), repeat=k)) if isinstance(draft, RandomLM) else [tuple(draft(ctx))]
    out = {}
    for seq in draft_seqs:
        draft_probs = rows(draft, seq, k) if isinstance(draft, RandomLM) else None
        q_seq = float(torch.prod(draft_probs[torch.arange(k), list(seq)])) if draft_probs is not None else 1.0
        if q_seq == 0:
            continue
        target_probs = rows(target, seq, k + 1)

        def emitted(rng, seq=seq, draft_probs=draft_probs, target_probs=target_probs) -> tuple:
            if params.greedy:
                verdict = verify_greedy(list(seq), target_probs)
            else:
                verdict = verify_rejection(list(seq), draft_probs, target_probs, rng)
            return seq[:verdict.num_accepted] + (verdict.next_token,)

        for tokens, prob in enumerate_outcomes(emitted).items():
            rest = k + 1 - len(tokens)
            for tail, p_tail in joint(want, ctx + tokens, rest).items() if rest else [((), 1.0)]:
                out[tokens + tail] = out.get(tokens + tail, 0.0) + q_seq * prob * p_tail
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("kw", SETTINGS, ids=[str(kw) for kw in SETTINGS])
def test_constrained_rejection_sampling_is_exact(kw, k):
    params = SamplingParams(**kw)
    target, draft = RandomLM(1, True, V), RandomLM(2, False, V)
    want = joint(ConstrainedLM(target, params, PROMPT, V), PROMPT + GENERATED, k + 1)
    assert_same(constrained_step(target, draft, params, k), want)
    # deterministic drafts inside the grammar ([0, 1, 0]) and leaving it ([1, 2]: 2 after 1; [0, 0])
    for drafts in ([0, 1, 0], [1, 2, 0], [0, 0, 1]):
        assert_same(constrained_step(target, lambda ctx, d=drafts: d[:k], params, k), want)


def test_greedy_constrained_step_is_the_constrained_argmax():
    params = SamplingParams(temperature=0.0)
    target = RandomLM(3, False, V)
    want = joint(ConstrainedLM(target, params, PROMPT, V), PROMPT + GENERATED, 3)
    assert len(want) == 1
    for drafts in ([0, 1], [1, 0], [1, 2], [0, 0]):
        assert_same(constrained_step(target, lambda ctx, d=drafts: d, params, 2), want)


def test_the_grammar_changes_the_target():
    """Not vacuous: the constrained joint differs from the plain one, and refuses sequences."""
    params = SamplingParams(temperature=1.0)
    target = RandomLM(1, True, V)
    constrained = joint(ConstrainedLM(target, params, PROMPT, V), PROMPT + GENERATED, 3)
    plain = joint(target, PROMPT + GENERATED, 3)
    assert set(constrained) < set(plain)
    assert all(s[0] != 2 and s[1] != s[0] and (s[0], s[1]) != (1, 2) for s in constrained)


def test_masks_that_ignore_the_drafts_are_caught():
    """Power check: masking every row with the committed state only (not the row's path) is biased."""
    params = SamplingParams(temperature=1.0)
    target, draft = RandomLM(1, True, V), RandomLM(2, False, V)
    want = joint(ConstrainedLM(target, params, PROMPT, V), PROMPT + GENERATED, 3)
    ignore_drafts = lambda drafts: [[] for _ in range(len(drafts) + 1)]  # noqa: E731
    with pytest.raises(AssertionError):
        assert_same(constrained_step(target, draft, params, 2, ignore_drafts), want, tol=1e-3)


# ---------------------------------------------------------------- trees

TV = 5


@pytest.mark.parametrize("paths", ["tree", "root only"])
def test_constrained_tree_verification_is_exact(paths):
    """Deterministic candidate trees (some nodes outside the grammar), the target's rows from
    one history and each node's path: emitted tokens follow the constrained target exactly;
    masking every node like the root is caught."""
    params = SamplingParams(temperature=1.0)
    lm = RandomLM(4, True, vocab_size=TV, power=3)
    ctx = PROMPT + GENERATED
    target = ConstrainedLM(lm, params, PROMPT, TV)
    # root children 0, 1, 3, 2 (2 repeats the last token: refused); under 1: 2 (refused), 0, 4; under 0: 0 (refused), 3
    tokens = [0, 1, 3, 2, 2, 0, 4, 0, 3]
    parents = [-1, -1, -1, -1, 1, 1, 1, 0, 0]
    rows_of = tree_paths if paths == "tree" else (lambda t, p: [[] for _ in range(len(t) + 1)])
    history = history_with_grammar(params, TV)
    logits = torch.stack([lm(ctx).log()]
                         + [lm(ctx + node_prefix(i, tokens, parents)).log() for i in range(len(tokens))])
    probs = final_probs(logits, params, history.rows(rows_of(tokens, parents)))

    def emitted(rng) -> tuple:
        verdict = verify_tree_sampling(tokens, parents, probs, rng)
        return tuple(tokens[i] for i in verdict.path) + (verdict.next_token,)

    outcomes = enumerate_outcomes(emitted)
    got, want = completions(target, ctx, outcomes, 3), completions(target, ctx, {(): 1.0}, 3)
    worst = max(abs(got.get(x, 0) - want.get(x, 0)) for x in set(got) | set(want))
    assert (worst < 1e-9) == (paths == "tree"), worst


# ---------------------------------------------------------------- the grammar state

def test_walks_roll_back_and_masks_are_cached():
    state = GrammarState(ToyMatcher(V), V)
    state.commit([2])
    first = state.masks([[], [0], [0, 1], [1, 2], [1, 2, 0]])
    assert first.tolist() == [[True, True, False], [False, True, True], [True, False, False],
                              [True] * 3, [True] * 3]  # after a refused token: all allowed (never used)
    assert state.matcher.tokens == [2]  # every walk rolled back
    assert state.mask([0, 1]) is state.mask([0, 1])  # cached within a step
    state.commit([0])
    assert state.mask([]).tolist() == [False, True, True]  # the cache is for the old state
    assert state.valid_prefix([1, 0, 0, 1]) == 2 and state.valid_prefix([0]) == 0
    with pytest.raises(SpecdecError, match="left the grammar"):
        state.commit([0])


def test_eos_ends_the_walk():
    state = GrammarState(ToyMatcher(V), V, eos_ids=frozenset({0}))
    state.commit([1, 0, 0, 0])  # everything after the EOS is ignored
    assert state.matcher.tokens == [1]
    assert state.valid_prefix([0, 2, 1]) == 1  # the EOS is kept, nothing after it
    assert state.mask([0]).all()


def test_response_format_shapes():
    assert grammar_from_response_format({"type": "text"}) is None
    assert grammar_from_response_format({"type": "json_object"}) == Grammar("json_object")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = grammar_from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert got == Grammar("json_schema", json.dumps(schema))
    assert grammar_from_response_format({"type": "regex", "regex": "a+"}) == Grammar("regex", "a+")
    for bad in ({"type": "xml"}, {"type": "json_schema"}, {"type": "regex"}, "json", {"type": "lark", "grammar": 3}):
        with pytest.raises(SpecdecError, match="response_format"):
            grammar_from_response_format(bad)
    with pytest.raises(SpecdecError, match="ignore_eos"):
        SamplingParams(grammar=Grammar("json_object"), ignore_eos=True)


# ---------------------------------------------------------------- llguidance, end to end

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                           "size": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "tags": {"type": "array", "items": {"enum": ["def", "class", "x"]},
                                                    "maxItems": 3}},
          "required": ["name", "size", "tags"], "additionalProperties": False}
FORMATS = {
    "schema": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    "regex": {"type": "regex", "regex": r"(def|class) [a-z_]{1,12}\((a|b|self)(, (a|b))*\):"},
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("t"), layers=2, kv_heads=1, max_pos=256)
    return target, {"draft": target, "ngram": None, "medusa": make_medusa_dir(tmp_path_factory.mktemp("m"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("e"), target)}


@pytest.fixture(scope="module")
def plain(dirs):
    return specdec.load(target=dirs[0], dtype="float64")


def valid(fmt: str, text: str) -> bool:
    if fmt == "schema":
        obj = json.loads(text)
        return set(obj) == {"name", "size", "tags"} and isinstance(obj["size"], int)
    return re.fullmatch(FORMATS["regex"]["regex"], text) is not None


@pytest.mark.parametrize("method", ["draft", "ngram", "medusa", "eagle"])
def test_greedy_identity_with_a_grammar(dirs, plain, method):
    """Constrained speculative == constrained plain, token for token; the output parses."""
    target, drafters = dirs
    spec = specdec.load(target=target, draft=drafters[method], method=method, dtype="float64",
                        draft_tokens=4 if method in ("draft", "ngram") else 8)
    drafted = 0
    for fmt, prompt in itertools.product(FORMATS, ["def add(a, b):", "".join(SAMPLE_TEXT[:4])]):
        want = plain.generate(prompt, max_new_tokens=60, response_format=FORMATS[fmt])
        got = spec.generate(prompt, max_new_tokens=60, response_format=FORMATS[fmt])
        assert got.token_ids == want.token_ids, (fmt, prompt)
        assert want.finish_reason == "stop" and valid(fmt, want.text), want.text
        drafted += got.stats.drafted_tokens
    assert drafted > 0


@pytest.mark.parametrize("method", ["draft", "ngram", "eagle"])
def test_seeded_identity_with_a_grammar(dirs, plain, method):
    """Seeded drafter-invariant sampling: every method gives plain decoding's tokens for a seed."""
    target, drafters = dirs
    spec = specdec.load(target=target, draft=drafters[method], method=method, dtype="float64",
                        draft_tokens=4 if method != "eagle" else 8)
    for seed in range(3):
        kw = dict(max_new_tokens=60, temperature=0.9, seed=seed, response_format=FORMATS["schema"])
        want = plain.generate("x = ", **kw)
        assert spec.generate("x = ", **kw).token_ids == want.token_ids
        assert want.finish_reason == "stop" and valid("schema", want.text), want.text


def test_sampled_output_follows_the_grammar(dirs):
    target, drafters = dirs
    spec = specdec.load(target=target, draft=drafters["draft"], method="draft", draft_tokens=4)
    for seed in range(4):
        r = spec.generate("x = ", max_new_tokens=60, temperature=1.0, seed=seed, seed_mode="rejection",
                          response_format=FORMATS["schema"])
        assert r.finish_reason == "stop" and valid("schema", r.text), r.text


def test_unconstrained_output_differs(plain):
    """Not vacuous: without the grammar the tiny model writes something else."""
    free = plain.generate("def add(a, b):", max_new_tokens=20)
    constrained = plain.generate("def add(a, b):", max_new_tokens=20, response_format=FORMATS["regex"])
    assert free.text != constrained.text and not valid("regex", free.text)


def test_bad_grammars_are_refused(plain):
    with pytest.raises(SpecdecError, match="grammar"):
        plain.generate("x", response_format={"type": "regex", "regex": "(unclosed"})
    with pytest.raises(SpecdecError, match="schema"):
        plain.generate("x", response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}})


def test_prompt_lookup_cuts_proposals_that_leave_the_grammar_and_adds_forced_tokens():
    from specdec.spec.proposers import PromptLookupProposer
    params = SamplingParams(temperature=1.0)
    history = history_with_grammar(params, V)  # last generated token: 2
    proposer = PromptLookupProposer(max_ngram=1)
    context = [0, 2, 0, 0, 1, 2]  # an earlier 2 was followed by 0, 0, 1, 2 (0 after 0 is refused)
    assert proposer.propose(context, 4, params, None).tokens == [0, 0, 1, 2]
    assert proposer.propose(context, 4, params, None, history=history).tokens == [0]
    assert proposer.propose([2, 2], 4, params, None, history=history).tokens == []  # 2 after 2: nothing left
    history.extend([0])  # now after 0: 1 and 2 allowed
    context = [0, 2, 1, 1, 0]  # an earlier 0 was followed by 2, 1, 1 (1 after 1 is refused)
    # cut after 2, 1; then 0 is forced (the only token allowed after 1), after 0 two are allowed
    assert proposer.propose(context, 4, params, None, history=history).tokens == [2, 1, 0]
    history.extend([1])  # after 1 only 0 is allowed: forced even without a lookup match
    assert proposer.propose([5], 4, params, None, history=history).tokens == [0]
    assert proposer.propose([5], 4, params, None).tokens == []


def test_batched_generation_with_a_grammar_equals_generate(dirs, plain):
    target, _ = dirs
    spec = specdec.load(target=target, draft=target, method="draft", dtype="float64", draft_tokens=4)
    prompts = ["def add(a, b):", "x = ", "import os\n"]
    want = [plain.generate(p, max_new_tokens=60, response_format=FORMATS["schema"]).token_ids for p in prompts]
    got = spec.generate_batch(prompts, max_batch=2, max_new_tokens=60, response_format=FORMATS["schema"])
    assert [r.token_ids for r in got] == want


# ---------------------------------------------------------------- chi-square through the engine

class NoEosToy(ToyMatcher):
    """The toy grammar, and token 0 (the tiny models' EOS) never: every sample has NEW tokens."""

    def allowed(self) -> torch.Tensor:
        row = super().allowed()
        row[0] = False
        return row


class ToyCompiler:
    """Stands in for the engine's GrammarCompiler: every grammar is the toy one."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def state(self, grammar: Grammar) -> GrammarState:
        return GrammarState(NoEosToy(self.vocab_size), self.vocab_size)


def toy_joint(target_dir, params: SamplingParams) -> dict:
    """The constrained target's exact joint of the first NEW (= 2) tokens, one prefix at a time."""
    from distribution import NEW, PROMPT, reference_probs
    from distribution import V as DV
    assert NEW == 2
    model = specdec.load(target=target_dir, dtype="float64").engine.target.model

    def row(output: list[int]) -> torch.Tensor:
        matcher = NoEosToy(DV)
        matcher.try_consume(output)
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + output]))[0, -1]
        return reference_probs(logits.masked_fill(~matcher.allowed(), float("-inf")), params, PROMPT, output)

    first = row([])
    return {(a, b): float(first[a] * second[b]) for a in range(DV) if first[a] > 0
            for second in [row([a])] for b in range(DV)}


def grammar_p_value(decoder, target_dir, params_kw: dict) -> float:
    from distribution import N_QUICK, NEW, PROMPT, chi_square_p
    decoder.engine._grammars = ToyCompiler(decoder.vocab_size)
    counts: dict = {}
    try:
        for seed in range(N_QUICK):
            ids = tuple(decoder.generate(PROMPT, max_new_tokens=NEW, seed=seed, seed_mode="rejection",
                                         grammar=Grammar("regex", "toy"), **params_kw).token_ids)
            counts[ids] = counts.get(ids, 0) + 1
        return chi_square_p(counts, toy_joint(target_dir, SamplingParams(**params_kw)))
    except (AssertionError, SpecdecError):  # emitted a token the grammar refuses (caught at commit or here)
        return 0.0


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from distribution import tiny_model_dir
    return (tiny_model_dir(tmp_path_factory.mktemp("gt"), seed=1, scale=0.5),
            tiny_model_dir(tmp_path_factory.mktemp("gd"), seed=1, scale=0.35))


@pytest.mark.parametrize("method", ["draft", "ngram", "medusa"])
def test_constrained_sampling_matches_the_constrained_target(tiny_dirs, method, tmp_path):
    pytest.importorskip("scipy")
    target, draft = tiny_dirs
    drafter = {"draft": draft, "ngram": None, "medusa": make_medusa_dir(tmp_path / "m", target)}[method]
    decoder = specdec.load(target=target, draft=drafter, method=method, draft_tokens=2 if method != "medusa" else 12)
    params_kw = dict(temperature=1.0, presence_penalty=0.5)
    assert grammar_p_value(decoder, target, params_kw) > 1e-3
    from distribution import NEW, PROMPT
    drafted = sum(decoder.generate(PROMPT, max_new_tokens=NEW, seed=s, grammar=Grammar("regex", "toy"),
                                   **params_kw).stats.drafted_tokens for s in range(5))
    assert drafted > 0


def test_masks_that_ignore_the_drafts_fail_the_same_test(tiny_dirs, monkeypatch):
    """Power check: the target's rows masked by the committed output only."""
    pytest.importorskip("scipy")
    import specdec.engine.verdicts
    monkeypatch.setattr(specdec.engine.verdicts, "chain_paths", lambda drafts: [[] for _ in range(len(drafts) + 1)])
    target, draft = tiny_dirs
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2)
    assert grammar_p_value(decoder, target, dict(temperature=1.0)) < 1e-3
