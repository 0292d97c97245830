"""Tree methods (Medusa, EAGLE) in continuous batching (engine/scheduler.py, models/batch.py): a
tree's rows share the batched pass with other sequences' chains and trees, each row at its
depth's position and seeing its own slot's cache and ancestors only. Greedy and seeded outputs
equal plain decoding alone (float64; bfloat16 in exact mode), sampled trees keep the target's
exact distribution (chi-square), and a batched tree pass gives each slot the logits of its
own single-sequence tree pass."""

from types import SimpleNamespace

import pytest
import torch

import specdec
import specdec.engine.verdicts
from specdec.engine.requests import generate_all
from specdec.engine.scheduler import Scheduler
from specdec.models.batch import BatchRunner
from specdec.models.cache import PassPlan
from specdec.sampling import SamplingParams
from specdec.spec.control.tree_size import TreeSizeController
from specdec.spec.verify import tree_attention_mask, tree_depths

from distribution import N_QUICK, NEW, PROMPT, interleaved_p_values, tiny_model_dir
from helpers import make_eagle_dir, make_medusa_dir, make_model_dir

PROMPTS = ["def add(a, b):\n    return a + b\n" * 3 + "def add", "class Point:\n", "x", "héllo wörld",
           "for i in range(10):\n    print(i * i)\n" * 2, "import os\nimport sys\n"]
MAX_TOKENS = [30, 9, 24, 17, 30, 12]
TREE_METHODS = ("medusa", "eagle")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("bt"), layers=2, kv_heads=1, max_pos=256)
    return target, {"medusa": make_medusa_dir(tmp_path_factory.mktemp("btm"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("bte"), target)}


def mixed(method: str, **sampling) -> list[tuple[str, dict]]:
    """Each prompt under the tree method, plain decoding and prompt lookup, in one batch."""
    return [(p, dict(sampling, max_new_tokens=m, method=which))
            for p, m in zip(PROMPTS, MAX_TOKENS) for which in (method, "none", "ngram")]


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("method", TREE_METHODS)
def test_greedy_trees_in_a_batch_equal_plain_decoding(dirs, method, dtype):
    """bfloat16 runs in exact mode: each tree row gets a 1-token pass's bits in the batch too.
    Three slots for 18 requests: sequences join and leave while trees are verified."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads[method], method=method, dtype=dtype, draft_tokens=8,
                        calibrate=False)
    plain = specdec.load(target=target, dtype=dtype, calibrate=False)
    requests = mixed(method)
    got = spec.generate_batch([p for p, _ in requests], [s for _, s in requests], max_batch=3)
    for g, (p, s) in zip(got, requests):
        assert g.token_ids == plain.generate(p, max_new_tokens=s["max_new_tokens"]).token_ids, (p, s)
    trees = [g for g, (_, s) in zip(got, requests) if s["method"] == method]
    assert sum(g.stats.drafted_tokens for g in trees) > 0  # trees were verified
    # every tree step but the first of a one-token prompt (no features yet) verified a tree
    assert sum(g.stats.num_drafts for g in trees) == sum(g.stats.target_forwards for g in trees) - 1


@pytest.mark.parametrize("method", TREE_METHODS)
def test_seeded_trees_in_a_batch_equal_plain_seeded_sampling(dirs, method):
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads[method], method=method, draft_tokens=8, calibrate=False)
    plain = specdec.load(target=target, calibrate=False)
    requests = [(p, dict(s, seed=7 + i)) for i, (p, s) in enumerate(mixed(method, temperature=0.8))]
    got = spec.generate_batch([p for p, _ in requests], [s for _, s in requests], max_batch=4)
    for g, (p, s) in zip(got, requests):
        s = {k: v for k, v in s.items() if k != "method"}
        assert g.token_ids == plain.generate(p, **s).token_ids
    assert sum(g.stats.drafted_tokens for g, (_, s) in zip(got, requests) if s["method"] == method) > 0


def test_a_batched_tree_pass_gives_each_slot_its_single_pass_logits(dirs):
    """Three slots: a tree, a chain and another tree of other sizes, one pass; each slot's
    logits and final hidden states equal its own single-sequence pass (tree mask, depth
    positions); keeping a tree's path leaves the slot as the single runner's keep does."""
    target, _ = dirs
    decoder = specdec.load(target=target, dtype="float64", calibrate=False)
    single, model = decoder.engine.target, decoder.engine.target.model
    batch = BatchRunner(model, 3, 64)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9]]
    parents = [[-1, -1, 0, 1, 2], None, [-1, 0, 0]]
    for slot, p in enumerate(prompts):
        batch.extend_slot(slot, p[:-1])
    rows = [[p[-1]] + [20, 21, 22, 23, 24][:len(par) if par else 2] for p, par in zip(prompts, parents)]
    trees = [None if par is None else tree_attention_mask(par).to(torch.bool) for par in parents]
    got = batch.forward(PassPlan(rows, trees=trees))
    for slot, (p, par) in enumerate(zip(prompts, parents)):
        single.reset()
        single.extend(p[:-1])
        start = single.length
        kwargs = {} if par is None else dict(attn_mask=tree_attention_mask(par),
                                             positions=start + torch.tensor([0] + tree_depths(par)))
        want = single.extend(rows[slot], want_hidden=True, **kwargs)
        torch.testing.assert_close(got[slot], want, rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.last_hidden[slot], single.last_hidden, rtol=0, atol=1e-12)
    batch.keep(0, len(prompts[0]) - 1, [0, 2, 4])  # the path root -> node 1 -> node 3
    assert batch.length(0) == len(prompts[0]) + 2
    after = batch.forward(PassPlan([[40], [41], [42]]))
    single.reset()
    single.extend(prompts[0][:-1] + [rows[0][0], rows[0][2], rows[0][4]])
    torch.testing.assert_close(after[0], single.extend([40]), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    target = tiny_model_dir(tmp_path_factory.mktemp("btt"), seed=1, scale=0.5)  # broad distributions
    return target, {"medusa": make_medusa_dir(tmp_path_factory.mktemp("bttm"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("btte"), target)}


FIXED_NODES = {"medusa": 12, "eagle": 8}  # every step verifies a full tree


def batched_tree_p_values(tiny_dirs, method: str, n: int = N_QUICK) -> list[float]:
    """n sequences at each of two temperatures share batches of 16 (rejection sampling over
    full trees): p-values of the first NEW tokens of each setting against the target's exact
    joint."""
    target, heads = tiny_dirs
    decoder = specdec.load(target=target, draft=heads[method], method=method, draft_tokens=FIXED_NODES[method],
                           calibrate=False)
    settings = [dict(temperature=0.7, top_k=5), dict(temperature=1.0)]
    requests = [(PROMPT, SamplingParams(max_new_tokens=NEW, seed=10 ** 6 + seed, seed_mode="rejection",
                                        ignore_eos=True, **settings[seed % 2]), method) for seed in range(2 * n)]
    results = generate_all(Scheduler(decoder.engine, max_batch=16, max_rows=16 * (FIXED_NODES[method] + 1)), requests)
    drafted = sum(r.stats.drafted_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    assert 0 < accepted < drafted
    return interleaved_p_values(results, settings, target)


@pytest.mark.parametrize("method", TREE_METHODS)
def test_batched_tree_sampling_keeps_the_target_distribution(tiny_dirs, method):
    """EAGLE's head runs a pass per sequence and tree level (~4x Medusa's time a sample): half
    the samples keep the default tier fast; the p-value stays valid, the power is Medusa's check."""
    assert min(batched_tree_p_values(tiny_dirs, method, N_QUICK if method == "medusa" else N_QUICK // 2)) > 1e-3


def test_a_wrong_tree_verifier_fails_the_batched_test(tiny_dirs, monkeypatch):
    """Power: tree rejection sampling that ignores the draft's distribution fails the check."""
    original = specdec.engine.verdicts.verify_tree_sampling

    def wrong_q(drafts, parents, target_probs, rng, draft_probs, draws):
        return original(drafts, parents, target_probs, rng, torch.full_like(draft_probs, 1 / draft_probs.shape[-1]),
                        draws)

    monkeypatch.setattr(specdec.engine.verdicts, "verify_tree_sampling", wrong_q)
    assert min(batched_tree_p_values(tiny_dirs, "medusa")) < 1e-3


def test_a_forked_drafter_proposes_once_a_step(dirs, monkeypatch):
    """Each sequence's own drafter runs once per step, at the budget its controller chose
    (not also as an early cheap drafter, which doubled EAGLE's drafting time)."""
    from specdec.spec.proposers.eagle import EagleProposer

    target, heads = dirs
    calls = []
    original = EagleProposer.propose
    monkeypatch.setattr(EagleProposer, "propose", lambda self, *a, **kw: calls.append(a[1]) or original(self, *a, **kw))
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", draft_tokens=8, calibrate=False)
    got = spec.generate_batch(PROMPTS[:3], [dict(max_new_tokens=20, method="eagle")] * 3, max_batch=3)
    assert len(calls) == sum(g.stats.num_drafts for g in got) > 0
    assert set(calls) == {8}  # the fixed tree size


def test_batched_sequences_learn_from_each_other_through_the_engine(dirs):
    """A finished sequence hands what its controller learned (tree sizes' tokens and seconds)
    to the engine's controller for its settings, and the next sequence starts from it."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", calibrate=False)
    shared = spec.engine.controller_for(SamplingParams())
    assert sum(shared.memory()["samples"].values()) == 0
    spec.generate_batch(PROMPTS[:2], [dict(max_new_tokens=24, method="eagle")] * 2, max_batch=2)
    learned = sum(shared.memory()["samples"].values())
    assert learned > 0
    batch = spec.scheduler(2)
    seq = batch.add(PROMPTS[2], SamplingParams(max_new_tokens=8), "eagle")
    assert sum(seq.controller.memory()["samples"].values()) > 0  # started from the learned state


def forked_entry() -> SimpleNamespace:
    """A forked sequence's entry as the gate reads it: its controller has measured no tree size,
    so the cost bound (every node accepted) leaves the judging to the gate."""
    return SimpleNamespace(forked=True, seq=SimpleNamespace(controller=TreeSizeController([1, 2, 4])))


@pytest.mark.parametrize("drafting_pays", [False, True])
def test_a_batch_drafts_with_forked_drafters_only_where_they_pay(dirs, drafting_pays):
    """Forked drafters run one sequence after another, a cost each sequence's controller does not
    see (each is charged the shared target pass whatever it drafts): the batch measures its own
    tokens a second with them and without (steps of 6 tokens in 40 ms against 2 in 10 ms, or 6 in
    10 ms against 2 in 10 ms) and keeps the better, re-measuring the other now and then."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", calibrate=False)
    drafting = spec.scheduler(2).drafting
    entries, on_steps = [forked_entry()] * 2, 0
    for _ in range(200):
        on = drafting.forked_gate(entries, [0, 1], [4, 4])
        on_steps += on
        drafting.gate.observe_step(6 if on else 2, (0.01 if drafting_pays else 0.04) if on else 0.01, 2)
    assert on_steps > 150 if drafting_pays else on_steps < 30
    drafting.forked_gate(entries, [0, 1], [0, 0])  # nothing to draft: no gate consulted
    assert drafting.gate.current is None


def test_a_larger_batch_does_not_explore_forked_drafting_where_a_smaller_one_lost(dirs):
    """Forked drafting only costs more in a fuller batch: once 2 sequences measured it slower
    than plain steps, 4 never pay for trying it, until the smaller batch finds it paying."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", calibrate=False)
    drafting = spec.scheduler(4).drafting
    entries = [forked_entry()] * 4

    def steps(ready: list[int], n: int, pays: bool) -> int:
        on_steps = 0
        for _ in range(n):
            on = drafting.forked_gate(entries, ready, [4] * len(ready))
            on_steps += on
            drafting.gate.observe_step(6 if on else 2, (0.01 if pays else 0.04) if on else 0.01, len(ready))
        return on_steps

    assert 0 < steps([0, 1], 40, pays=False) < 10  # explored, then off
    assert steps([0, 1, 2, 3], 40, pays=False) == 0
    assert drafting.gate.buckets[4].samples[0] == 40  # its plain steps still measured
    steps([0, 1], 300, pays=True)  # the smaller batch's probes find drafting paying
    assert steps([0, 1, 2, 3], 40, pays=True) > 20


def test_the_forked_gate_judges_steps_per_sequence_against_a_plain_pass_over_as_many(dirs):
    """A bucket holds batches of 2 to 3 sequences here: drafting measured only in steps of 3
    gives more tokens a second than plain steps of 2 (222 vs 200) while losing against a plain
    pass over 3 (4/3 tokens a sequence in 1.5 such passes): the gate turns drafting off."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", calibrate=False)
    drafting = spec.scheduler(4).drafting
    drafting.width.target.seconds = {1: 0.008, 2: 0.010, 3: 0.012, 4: 0.014}  # a plain pass by rows
    entries = [forked_entry()] * 3
    on_steps = 0
    for _ in range(60):
        on = drafting.forked_gate(entries, [0, 1, 2], [4] * 3)
        on_steps += on
        if on:  # drafting steps: 3 sequences
            drafting.gate.observe_step(4, 0.018, 3)
        else:  # plain steps: 2 sequences (the third still prefilling)
            drafting.gate.observe_step(2, 0.010, 2)
    gate = drafting.gate.buckets[2]
    assert gate.rate(1) < gate.rate(0) and on_steps < 10


def test_forked_drafting_is_not_tried_where_even_its_measured_acceptance_cannot_pay():
    """Where a pass is compute-bound (rows cost the same in a pass of 16 or 32, as 16
    sequences on SmolLM2 here) one-node trees whose node is accepted 70% of the time cannot
    beat plain steps, whatever drafting costs: the gate does not explore there. Unmeasured
    sizes count as always accepted (so a new batch still explores), and where passes are
    weight-bound (4 rows cost little more than 2) the same acceptance may pay."""
    from specdec.spec.control.batch_width import BatchDraftLength
    from specdec.spec.control.forked_gate import ForkedGate

    def controller(accepted: float | None) -> TreeSizeController:
        c = TreeSizeController([1, 2, 4])
        if accepted is not None:  # 8 steps of one-node trees measured: 1 + accepted tokens a step
            c.samples[1], c.weight[1], c.tokens[1], c.seconds[1] = 8, 8.0, 8 * (1 + accepted), 0.08
        return c

    width = BatchDraftLength()
    width.target.seconds = {2: 0.0102, 4: 0.0105, 16: 0.0392, 32: 0.075}
    gate = ForkedGate(width)
    assert not gate.could_pay(16, [(controller(0.7), 1)] * 16)
    assert gate.could_pay(16, [(controller(None), 1)] * 16)  # not measured: every node accepted
    assert gate.could_pay(2, [(controller(0.7), 1)] * 2)
    assert not gate.could_pay(2, [(TreeSizeController([2, 4]), 1)] * 2)  # no size it may choose fits
    seen = gate.allows(16, [(controller(0.7), 1)] * 16), gate.current
    assert seen == (False, None) and not gate.buckets  # no bucket explored or charged


def test_forked_drafting_is_charged_the_forks_measured_seconds():
    """The forks draft one after another, so a batch pays each one's drafting: drafts accepted
    70% of the time that pay where drafting is free (passes of 2 and 4 rows cost about the same)
    do not once the forks measured 3.7 ms a drafted token, and pay again when they draft faster."""
    from specdec.spec.control.batch_width import BatchDraftLength
    from specdec.spec.control.forked_gate import ForkedGate

    c = TreeSizeController([1, 2, 4])
    c.samples[1], c.weight[1], c.tokens[1], c.seconds[1] = 8, 8.0, 8 * 1.7, 0.08
    width = BatchDraftLength()
    width.target.seconds = {2: 0.0102, 4: 0.0105}
    gate = ForkedGate(width)
    assert gate.could_pay(2, [(c, 1)] * 2)  # not measured: free
    gate.observe_drafting(0.0, 1)  # nothing measured
    gate.observe_drafting(0.004, 0)
    assert gate.draft_seconds_per_token is None
    gate.observe_drafting(0.0074, 2)
    assert gate.draft_seconds_per_token == pytest.approx(0.0037)
    assert not gate.could_pay(2, [(c, 1)] * 2)
    gate.observe_drafting(1.0, 1)  # a stall: counted at twice the estimate, not as measured
    assert gate.draft_seconds_per_token == pytest.approx(0.8 * 0.0037 + 0.2 * 0.0074)
    for _ in range(20):
        gate.observe_drafting(0.001, 1)
    assert gate.could_pay(2, [(c, 1)] * 2)


def test_one_node_drafts_read_together_are_charged_apart_and_explored_by_any_batch():
    """Read together (one head pass for all), one-node drafts are charged what such passes
    measured a node, not the forks' own drafting; they have their own buckets, and a smaller
    batch's loss does not keep a larger one from trying them (a node costs less the fuller the
    batch). A step's catch-up (features left by plain steps) is kept out of a bucket's rates."""
    from specdec.spec.control.batch_width import BatchDraftLength
    from specdec.spec.control.forked_gate import ForkedGate

    c = TreeSizeController([1, 2, 4])
    c.samples[1], c.weight[1], c.tokens[1], c.seconds[1] = 8, 8.0, 8 * 1.7, 0.08
    width = BatchDraftLength()
    width.target.seconds = {2: 0.0102, 4: 0.0105, 8: 0.0110}
    gate = ForkedGate(width)
    gate.observe_drafting(0.0074, 2)  # forks alone: 3.7 ms a node
    gate.observe_drafting(0.0002, 4, together=True)  # read together: 0.05 ms a node
    assert gate.draft_seconds_per_token == pytest.approx(0.0037)
    assert gate.together_seconds_per_token == pytest.approx(0.00005)
    assert not gate.could_pay(4, [(c, 1)] * 4) and gate.could_pay(4, [(c, 1)] * 4, together=True)
    small = gate.buckets.setdefault(2, TreeSizeController([1]))  # 2 sequences measured drafting losing
    small.samples, small.tokens, small.seconds, small.weight = {0: 4, 1: 4}, {0: 4.0, 1: 4.0}, {0: 1.0, 1: 2.0}, \
        {0: 4.0, 1: 4.0}
    for _ in range(4):  # a bucket measures plain steps first
        assert not gate.allows(4, [(c, 1)] * 4, together=True)
        gate.observe_step(4, 0.0105, 4)
    assert gate.allows(4, [(c, 1)] * 4, together=True) and 4 not in gate.buckets
    # a drafted step of 4 sequences: 7 tokens in 2 plain passes' time, of which 1 the catch-up
    gate.observe_step(7, 2 * 0.0105, 4, sync_seconds=0.0105)
    bucket = gate.together_buckets[4]
    assert bucket.seconds[1] == pytest.approx(1.0) and bucket.tokens[1] == pytest.approx(7 / 4)


def test_a_batch_step_teaches_a_controller_only_what_it_chose_or_drafted(dirs, monkeypatch):
    """A sequence's controller learns from the steps it drafted in, or whose budget it chose;
    not from the steps its batch kept plain (their seconds are the whole batch's pass)."""
    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", calibrate=False)
    seen = []
    original = TreeSizeController.observe
    monkeypatch.setattr(TreeSizeController, "observe", lambda self, step: seen.append(step.budget) or
                        original(self, step))
    batch = spec.scheduler(3)
    batch.drafting.gate.allows = lambda *a, **kw: False  # the batch keeps every step plain
    got = spec.generate_batch(PROMPTS[:3], [dict(max_new_tokens=12, method="eagle")] * 3, max_batch=3)
    assert sum(g.stats.num_drafts for g in got) == 0
    steps = sum(len(g.token_ids) for g in got)
    assert len(seen) < steps // 3  # only steps with a sequence alone (its controller chose), none of the batch's


def test_a_batch_measures_its_forks_drafting(dirs, monkeypatch):
    """Every fork's drafting is timed for the gate, at the budget it drafted."""
    from specdec.spec.control.forked_gate import ForkedGate

    target, heads = dirs
    seen = []
    original = ForkedGate.observe_drafting
    monkeypatch.setattr(ForkedGate, "observe_drafting", lambda self, s, t: seen.append((s, t)) or original(self, s, t))
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", draft_tokens=8, calibrate=False)
    got = spec.generate_batch(PROMPTS[:3], [dict(max_new_tokens=20, method="eagle")] * 3, max_batch=3)
    assert len(seen) == sum(g.stats.num_drafts for g in got) > 0
    assert {t for _, t in seen} == {8} and all(s > 0 for s, _ in seen)


def test_eagle_one_node_drafts_are_read_together_and_keep_greedy_output(dirs, monkeypatch):
    """Greedy EAGLE forks drafting one node each step read their unread features through the
    head in one pass for all of them (spec/proposers/batch_eagle.py); outputs equal plain
    decoding's, in bfloat16 exact mode, while sequences join and leave."""
    from specdec.spec.proposers.batch_eagle import BatchEagleHeads

    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", dtype="bfloat16", draft_tokens=1,
                        calibrate=False)
    if spec.engine.proposer.head.stack is None:
        pytest.skip("the head is not on the one-call stack here (kernels unavailable)")
    together = []
    original = BatchEagleHeads.propose_one
    monkeypatch.setattr(BatchEagleHeads, "propose_one",
                        lambda self, forks, *a: together.append(len(forks)) or original(self, forks, *a))
    plain = specdec.load(target=target, dtype="bfloat16", calibrate=False)
    requests = [(p, dict(max_new_tokens=m, method=which)) for p, m in zip(PROMPTS, MAX_TOKENS)
                for which in ("eagle", "none")]
    got = spec.generate_batch([p for p, _ in requests], [s for _, s in requests], max_batch=4)
    for g, (p, s) in zip(got, requests):
        assert g.token_ids == plain.generate(p, max_new_tokens=s["max_new_tokens"]).token_ids, (p, s)
    assert together and max(together) >= 2
    eagle = [g for g, (_, s) in zip(got, requests) if s["method"] == "eagle"]
    assert sum(g.stats.drafted_tokens for g in eagle) > 0  # (a random head's nodes are rarely kept)


def test_forks_read_together_draft_what_each_drafts_alone(dirs):
    """BatchEagleHeads.propose_one gives each fork the node its own propose(context, 1) gives,
    and leaves its head where that leaves it (features read, root feature), from different
    contexts and different numbers of unread features (plain steps between drafts)."""
    from specdec.spec.proposers.batch_eagle import BatchEagleHeads

    target, heads = dirs
    spec = specdec.load(target=target, draft=heads["eagle"], method="eagle", dtype="float32", calibrate=False)
    proposer = spec.engine.proposer
    if proposer.head.stack is None:
        pytest.skip("the head is not on the one-call stack here (kernels unavailable)")
    together = BatchEagleHeads(proposer, 3)
    forks, alone = [together.fork() for _ in range(3)], [proposer.fork() for _ in range(3)]
    torch.manual_seed(0)
    d = proposer.head.config.hidden_size
    contexts = [list(range(5, 5 + n)) for n in (6, 11, 3)]
    params = SamplingParams()
    for round_ in range(3):
        for i, context in enumerate(contexts):
            # the prompt's features, then a step or a few plain steps' worth
            feats = torch.randn(len(context) - 1 if round_ == 0 else 1 + (i + round_) % 3, d)
            for fork in (forks[i], alone[i]):
                fork.observe_target(feats)
            if round_:
                context += [7 + round_] * feats.shape[0]
        got, _ = together.propose_one(forks, contexts, params)
        for i, context in enumerate(contexts):
            own = alone[i].propose(context, 1, params, None)
            assert got[i].tokens == own.tokens and own.parents == [-1] and got[i].parents is None  # a chain of one
            assert forks[i].committed == alone[i].committed == len(context) - 1
            assert torch.allclose(forks[i].root_feature.float(), alone[i].root_feature.float(), atol=1e-4)
