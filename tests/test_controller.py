"""The adaptive draft-length controller, on synthetic costs and acceptance."""
import random

from specdec.spec.control.draft_length import DraftLengthController
from specdec.spec.control.tree_size import TreeSizeController
from specdec.stats import StepRecord


def record(budget, drafted, accepted, target_seconds, draft_seconds, other_seconds):
    """A synthetic step; `accepted` may be fractional to model an average acceptance."""
    return StepRecord(budget=budget, drafted=drafted, accepted=accepted, new_tokens=(), text="",
                      draft_seconds=draft_seconds, sync_seconds=0.0, target_seconds=target_seconds,
                      other_seconds=other_seconds)


def simulate(controller, acceptance: float, target_cost, draft_cost: float, steps: int = 400, seed: int = 0):
    rnd = random.Random(seed)
    ks = []
    for _ in range(steps):
        k = controller.choose(16)
        n = 0
        while n < k and rnd.random() < acceptance:
            n += 1
        controller.observe(record(k, k, n, target_cost(k), draft_cost * k, 0.0))
        ks.append(k)
    return ks


def test_useless_draft_turns_speculation_off():
    c = DraftLengthController(max_k=8)
    ks = simulate(c, 0.0, lambda k: 1.0 + 0.05 * k, 0.2)
    tail = ks[100:]
    assert sum(k == 0 for k in tail) / len(tail) > 0.9  # plain steps, with rare probes
    assert any(k > 0 for k in tail)  # still probing


def test_good_cheap_draft_drafts_long():
    c = DraftLengthController(max_k=8)
    ks = simulate(c, 0.9, lambda k: 1.0 + 0.02 * k, 0.02)
    assert sum(ks[50:]) / len(ks[50:]) > 5


def test_choice_maximises_modelled_rate():
    c = DraftLengthController(max_k=8)
    simulate(c, 0.6, lambda k: 1.0 + 0.1 * k, 0.15, steps=300)
    a = c.acceptance
    rate = lambda k: (1 - a ** (k + 1)) / (1 - a) / (1.0 + 0.1 * k + 0.15 * k)
    best = max(range(9), key=rate)
    assert abs(c.choose(16) - best) <= 1


def test_fixed_k_and_limit():
    c = DraftLengthController(fixed_k=5)
    assert c.choose(16) == 5 and c.choose(3) == 3 and c.choose(0) == 0


def test_tree_controller_prefers_faster_option():
    c = TreeSizeController(sizes=[4, 16])
    tokens = {0: 1.0, 4: 2.0, 16: 2.2}
    seconds = {0: 1.0, 4: 1.2, 16: 2.0}
    picks = []
    for _ in range(200):
        k = c.choose(100)
        c.observe(record(k, k, tokens[k] - 1, seconds[k], 0.0, 0.0))
        picks.append(k)
    n = c.min_samples
    assert picks[:2 * n] == [0] * n + [4] * n  # tries sizes upwards, a few steps each
    assert sum(p == 4 for p in picks[2 * n:]) / len(picks[2 * n:]) > 0.85


def test_tree_controller_stays_plain_when_trees_lose():
    """High temperature: every tree costs more than it yields. Once the smallest tree has lost
    to plain steps, the larger ones are not tried at all (each would cost more: at T=1 trying
    them all made one-shot calls slower than plain decoding); probes thin out, so nearly every
    step is plain."""
    c = TreeSizeController(sizes=[4, 8, 16, 32])
    tokens = {0: 1.0, 4: 1.2, 8: 1.3, 16: 1.4, 32: 1.5}
    seconds = {0: 1.0, 4: 2.2, 8: 2.5, 16: 3.0, 32: 3.5}
    picks = []
    for _ in range(1000):
        k = c.choose(100)
        c.observe(record(k, k, tokens[k] - 1, seconds[k], 0.0, 0.0))
        picks.append(k)
    n = c.min_samples
    assert picks[:2 * n] == [0] * n + [4] * n and not {8, 16, 32} & set(picks)
    assert sum(p == 0 for p in picks[2 * n:]) / len(picks[2 * n:]) > 0.98


def test_tree_controller_ignores_one_stall():
    c = TreeSizeController(sizes=[8])
    for _ in range(6):
        k = c.choose(100)
        c.observe(record(k, k, 2.0 if k else 0.0, 1.0, 0.0, 0.0))  # trees: 3 tokens per second-long step
    c.observe(record(8, 8, 2.0, 100.0, 0.0, 0.0))  # one step stalls (a page fault, a noisy neighbour)
    assert c.choose(100) == 8


def test_cold_first_steps_do_not_keep_speculation_off():
    """The first passes of a new shape run 20x slow (kernels being built). Timings are only
    ever inflated, so one normal measurement replaces such an estimate: the draft is back in
    use at its best length instead of being judged by its cold start for good."""
    c = DraftLengthController(max_k=8)
    rnd = random.Random(0)
    ks = []
    for step in range(300):
        k = c.choose(16)
        cold = 20.0 if step < 2 else 1.0
        n = 0
        while n < k and rnd.random() < 0.7:
            n += 1
        c.observe(record(k, k, n, (1.0 + 0.05 * k) * (cold if k else 1.0), 0.05 * k * cold, 0.0))
        ks.append(k)
    assert abs(c.draft_seconds_per_token - 0.05) < 0.01
    # the cold K = 4 timing goes stale and is forgotten: K settles near the best (4) again
    assert 3 <= sum(ks[-100:]) / 100 <= 6


def test_tree_controller_forgets_a_cold_start():
    c = TreeSizeController(sizes=[8])
    seen = []
    for _ in range(200):
        k = c.choose(100)
        cold = 20.0 if k and c.samples.get(k, 0) < 2 else 1.0  # both first tree steps cold
        c.observe(record(k, k, 2.0 if k else 0.0, cold, 0.0, 0.0))  # trees: 3 tokens per 1 s step
        seen.append(k)
    assert sum(k == 8 for k in seen[-50:]) > 40


def test_new_sequence_probes_again_after_a_plain_phase():
    """Text where the draft is useless pushes the probe gap to its maximum (160 steps, longer
    than a whole answer); the next sequence must not inherit that: it probes at once, and if
    the draft is good there it drafts from then on."""
    c = DraftLengthController(max_k=8)
    simulate(c, 0.0, lambda k: 1.0 + 0.05 * k, 0.05, steps=400)
    assert c.probe_gap == c.max_probe_every
    c.start_sequence()
    ks = simulate(c, 0.9, lambda k: 1.0 + 0.05 * k, 0.05, steps=60)
    assert ks[0] > 0 and sum(k > 0 for k in ks) > 50


def test_calibrated_costs_decide_the_first_step():
    """Seeded with measured costs, the first step is chosen by the cost model instead of a
    blind speculative probe: a draft that costs more than it can save is not run at all."""
    costs = {0: 1.0, 1: 1.05, 2: 1.1, 4: 1.2, 8: 1.4}
    expensive = DraftLengthController(max_k=8, target_seconds=dict(costs), draft_seconds_per_token=5.0)
    cheap = DraftLengthController(max_k=8, target_seconds=dict(costs), draft_seconds_per_token=0.01)
    assert expensive.choose(16) == 0
    assert cheap.choose(16) > 0


def test_engine_calibration_seeds_controllers_and_leaves_output_unchanged():
    import specdec
    from specdec.sampling import SamplingParams

    calibrated = specdec.load(method="draft")
    costs = calibrated.engine.pass_costs
    assert set(costs.target_seconds) >= {0, 1, 8} and all(t > 0 for t in costs.target_seconds.values())
    assert costs.draft_seconds_per_token > 0
    controller = calibrated.engine.controller_for(SamplingParams(temperature=1.0))
    assert controller.target_seconds == costs.target_seconds
    assert calibrated.engine.target.length == 0  # the dummy passes left nothing in the cache
    plain = specdec.load(method="draft", calibrate=False)
    assert plain.engine.pass_costs is None
    prompt = "def parse(line):"
    want = plain.generate(prompt, max_new_tokens=24).token_ids
    assert calibrated.generate(prompt, max_new_tokens=24).token_ids == want



def test_calibration_runs_the_draft_models_two_token_catch_up_pass():
    """After a step that accepted every draft, the draft model catches up on two tokens at once:
    calibration runs that width too, so that its kernels (with --compile, its graph: ~5 s) are
    not built inside the first generation."""
    import specdec
    from specdec.spec.calibrate import measure_pass_costs

    decoder = specdec.load(method="draft", calibrate=False)
    engine = decoder.engine
    runner = engine.proposer.runner
    widths = []
    extend = runner.extend
    runner.extend = lambda ids, *args, **kwargs: widths.append(len(ids)) or extend(ids, *args, **kwargs)
    measure_pass_costs(engine.target, engine.proposer, 4, 0)
    assert 2 in widths[1:]  # not the prompt's prefill (the first pass)
    assert engine.proposer.ahead  # its prompt-lookup guesses, off while a draft pass was timed, back on


def test_calibrated_draft_cost_leaves_out_the_read_before_the_drafts():
    """A draft model reads its context before drafting (timed apart in a step, sync_seconds, and
    left out of the controller's draft cost): the calibration leaves it out too. With it, the
    Qwen pair's 0.5B draft measured ~18 ms a draft against 10-13 in its steps (Zen 3), and the
    controller then decoded whole answers plainly. Without prefix reuse every timed draft reads
    its context again (with it, the draft cache keeps the context between the timed drafts)."""
    import time

    import specdec
    from specdec.spec.calibrate import measure_pass_costs

    decoder = specdec.load(method="draft", calibrate=False, reuse_prefix=False)
    engine = decoder.engine
    runner = engine.proposer.runner
    extend = runner.extend

    def slow_reads(ids, *args, **kwargs):
        if len(ids) > 2:  # a read of the context, not a draft pass (one token, or a two-token catch-up)
            time.sleep(0.2)
        return extend(ids, *args, **kwargs)
    runner.extend = slow_reads
    costs = measure_pass_costs(engine.target, engine.proposer, 4, 0)
    assert 0 < costs.draft_seconds_per_token < 0.2 / 4


def probing_overhead(controller, sequences: int = 60, steps: int = 16) -> float:
    """Time beyond all-plain decoding, as a share of it, where drafts are never accepted and
    each short request is a new sequence (a probe: ~2x a plain step, its drafter's
    catch-up included)."""
    spent = plain = 0.0
    for _ in range(sequences):
        controller.start_sequence()
        for _ in range(steps):
            k = controller.choose(16)
            target, draft, sync = (1.0, 0.0, 0.0) if k == 0 else (1.5, 0.1 * k, 0.4)
            controller.observe(StepRecord(budget=k, drafted=k, accepted=0, new_tokens=(), text="", draft_seconds=draft,
                                          sync_seconds=sync, target_seconds=target, other_seconds=0.0))
            spent += target + draft + sync
            plain += 1.0
    return spent / plain - 1


def test_probing_costs_at_most_a_few_percent_however_many_sequences_start():
    """At T=1 drafts are rarely accepted: every probe is a loss. New sequences used to restart
    probing (a probe every ~16 steps of short requests: ~7% slower than plain); the probe
    budget keeps the loss within ~2-3% of the time, for chains and trees alike (a chain's
    evidence is also no longer halved below a few steps' worth by each new sequence)."""
    from specdec.spec.control.base import ProbeBudget

    for make in (lambda: DraftLengthController(max_k=8), lambda: TreeSizeController(sizes=[2, 4, 8])):
        assert probing_overhead(make()) < 0.03
        unbounded = make()
        unbounded.budget = ProbeBudget(share=float("inf"))
        assert probing_overhead(unbounded) > 0.05
