"""A draft model reads its prompt at its first draft; a lone sequence drafts only where the tokens
left repay that read, and not before the first token (spec/control/draft_length.py choose,
engine/batch_drafting.py own_budget): a short answer to a long prompt is decoded without it (prompt
lookup's drafts standing in where greedy), never slower than plain decoding, and a streamed answer
starts at plain decoding's time."""
import random

import pytest
from test_controller import record, simulate

import specdec
from specdec.spec.control.draft_length import DraftLengthController
from specdec.spec.proposers.draft_model import READ_SAMPLE

from helpers import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("read_gate"), layers=2, kv_heads=1)


def drafting_pays() -> DraftLengthController:
    """A controller that has learned that K = 8 gains ~4x: 1 s a plain pass, 0.9 acceptance."""
    c = DraftLengthController(max_k=8)
    simulate(c, 0.9, lambda k: 1.0 + 0.02 * k, 0.02, steps=200)
    assert c.choose(8) > 0
    return c


def test_drafting_waits_until_the_tokens_left_repay_the_read():
    c = drafting_pays()
    a = c.acceptance
    seconds_per_token = {k: c.step_cost(k) / ((1 - a ** (k + 1)) / (1 - a)) for k in range(9)}
    k = c.choose(8)
    saving = seconds_per_token[0] - seconds_per_token[k]  # ~0.7 s a token
    assert c.choose(8, upfront_seconds=10 * saving, horizon=9) == 0  # 9 tokens save less than the read
    assert c.held_back  # plain only because of the read: prompt lookup may stand in
    assert c.choose(8, upfront_seconds=10 * saving, horizon=11) == k and not c.held_back
    assert c.choose(8, upfront_seconds=0.0, horizon=1) == k  # nothing to read: nothing to repay
    assert DraftLengthController(fixed_k=3).choose(8, upfront_seconds=1e9, horizon=1) == 3  # a fixed K is kept
    # the first token never waits for the read, however long the answer
    assert c.choose(8, upfront_seconds=saving, horizon=10_000, first_token=True) == 0
    assert c.choose(8, upfront_seconds=0.0, horizon=10_000, first_token=True) == k


def test_a_probe_pays_a_read_only_within_a_tenth_of_the_plain_steps_since_the_last_draft():
    c = DraftLengthController(max_k=8)
    simulate(c, 0.0, lambda k: 1.0 + 0.05 * k, 0.2)  # useless drafts: plain steps and rare probes
    assert any(c.choose(8) for _ in range(400))
    # a long prompt never read (an editor's completion): 1,000 plain steps' worth, never paid
    assert not any(c.choose(8, upfront_seconds=1000.0, horizon=1000) for _ in range(400))
    assert not c.held_back  # plain because drafting does not pay, read or not
    assert c.probe_read_fits(0.1 * c.plain_streak * c.step_cost(0))
    assert not c.probe_read_fits(0.11 * c.plain_streak * c.step_cost(0))


def test_unlucky_first_drafts_do_not_switch_drafting_off_for_the_rest_of_the_answer():
    """The Qwen pair's costs (a draft token ~0.45 of a plain step, reading a token ~0.065): two
    rejected first drafts put the estimate below break-even; every plain step then adds a token
    the draft has not read, which a probe at that estimate never repaid, so drafting stayed off
    though ~85% of drafts would be kept. Probes resume, and drafting with them."""
    rnd = random.Random(0)
    c = DraftLengthController(max_k=8)
    c.observe(record(0, 0, 0, 1.0, 0.0, 0.0))
    ks, unread, left = [], 0, 400
    for step in range(300):
        k = c.choose(8, upfront_seconds=0.065 * unread, horizon=left)
        kept = 0
        while kept < k and rnd.random() < (0.0 if step < 2 else 0.85):
            kept += 1
        c.observe(record(k, k, kept, 1.0 + 0.08 * k, 0.45 * k, 0.0))
        unread = 0 if k else unread + 1  # a draft first reads what it lacks
        left -= kept + 1
        ks.append(k)
        if left <= 0:
            break
    assert ks[:2] != [0, 0] and 0 in ks[2:10]  # it drafted, lost, and went plain
    assert sum(k > 0 for k in ks[len(ks) // 2:]) > 0.8 * (len(ks) - len(ks) // 2)  # and drafts again


def test_the_draft_times_its_reading_and_counts_what_it_lacks(model_dir):
    decoder = specdec.load(target=model_dir, dtype="float32", method="draft", draft=model_dir)
    draft = decoder.engine.proposer
    context = list(range(3, 3 + READ_SAMPLE + 8))
    draft.reset(context[:4])
    draft.read_seconds_per_token = None
    assert draft.upfront_seconds(context) == 0.0  # not timed yet: drafting decides as before
    draft.propose(context, 2, specdec.SamplingParams(), None)
    assert draft.read_seconds_per_token > 0  # the catch-up of the prompt timed it
    assert len(draft.cached) == len(context) + 1  # the context and the first draft (the last is not fed)
    longer = context + list(range(50, 90))
    # 40 tokens more, less the draft the cache holds past the context, less the 2 a draft pass
    # takes in by itself
    assert draft.upfront_seconds(longer) == pytest.approx(37 * draft.read_seconds_per_token)
    assert draft.upfront_seconds(context) == 0.0


def test_a_short_answer_never_reads_the_prompt_with_the_draft(model_dir):
    plain = specdec.load(target=model_dir, dtype="float64")
    spec = specdec.load(target=model_dir, dtype="float64", method="draft", draft=model_dir, calibrate=True,
                        memory=False)
    draft = spec.engine.proposer
    assert draft.read_seconds_per_token > 0  # calibration timed a read
    prompt = "def f(x):\n    return x + 1\n" * 6
    want = plain.generate(prompt, max_new_tokens=6, temperature=0).token_ids
    controller = spec.engine.controller_for(specdec.SamplingParams(temperature=0))
    learned = (controller.accepted_count, controller.rejected_count, controller.draft_seconds_per_token)
    draft.read_seconds_per_token = 1.0  # a read far slower than 6 tokens can repay
    got = spec.generate(prompt, max_new_tokens=6, temperature=0)
    assert got.token_ids == want
    assert len(draft.cached) < 2  # the prompt never read
    # prompt lookup's drafts stood in (the prompt repeats itself): the draft's controller learned nothing
    assert got.stats.drafted_tokens > 0
    assert (controller.accepted_count, controller.rejected_count, controller.draft_seconds_per_token) == learned
    draft.read_seconds_per_token = 1e-12  # a read any answer repays: still not before the first token
    got = spec.generate(prompt, max_new_tokens=1, temperature=0)
    assert got.token_ids == want[:1] and len(draft.cached) < 2


def test_no_stand_in_when_sampling(model_dir):
    """Prompt lookup stands in for a held-back draft model only in greedy decoding."""
    spec = specdec.load(target=model_dir, dtype="float64", method="draft", draft=model_dir, calibrate=True,
                        memory=False)
    spec.engine.proposer.read_seconds_per_token = 1.0
    got = spec.generate("def f(x):\n    return x + 1\n" * 6, max_new_tokens=6, temperature=1.0, seed=3)
    assert got.stats.drafted_tokens == 0 and len(spec.engine.proposer.cached) < 2


def test_short_requests_pay_a_read_that_none_repays_alone_once_their_plain_steps_add_up():
    """An editor's completions: ~50 tokens each under the same long file, the draft's read of it
    (50 plain steps' time) repaid by no single request. The plain steps since the last draft count
    across requests, so within a share of them the read is paid once (a probe); the draft then keeps
    its cache for the next requests (DraftModelProposer.reset), where drafting pays."""
    c = drafting_pays()
    steps_before_probe = None
    for request in range(10):
        c.start_sequence()
        for step in range(50):
            if c.choose(8, upfront_seconds=50 * c.step_cost(0), horizon=50 - step, first_token=step == 0):
                steps_before_probe = 50 * request + step
                break
        if steps_before_probe is not None:
            break
    # 50 plain steps' read within a tenth of the plain time: ~500 plain steps, ten requests' worth
    assert steps_before_probe is not None and 450 <= steps_before_probe < 500
    assert c.probing



def test_a_request_that_goes_on_from_a_cached_prompt_counts_one_more_like_it():
    """A one-off request's read must be repaid by its own tokens left; one whose prompt reused the
    cache an earlier request left (an editor's next completion) counts one more request of its
    length too, since the draft keeps what it reads (engine/batch_drafting.py own_budget)."""
    from types import SimpleNamespace

    from specdec.engine.batch_drafting import BatchDrafting

    c = drafting_pays()
    k = c.choose(8)
    a = c.acceptance
    saving = c.step_cost(0) - c.step_cost(k) / ((1 - a ** (k + 1)) / (1 - a))  # a token, at K
    read = 60 * saving  # repaid by 60 tokens' saving: not by 50, by 50 + 50

    def budget(cached_prompt_tokens: int) -> int:
        seq = SimpleNamespace(controller=c, context=[1] * 2000, generated=[5], remaining=50,
                              params=SimpleNamespace(max_new_tokens=51),
                              stats=SimpleNamespace(cached_prompt_tokens=cached_prompt_tokens))
        entry = SimpleNamespace(seq=seq, tree=False, proposer=SimpleNamespace(upfront_seconds=lambda context: read))
        return BatchDrafting.own_budget(entry, 8, alone=True)

    assert budget(0) == 0 and c.held_back  # a one-off request: 50 tokens do not repay the read
    assert budget(1900) == k  # its prompt went on from a cached one: 50 + 51 tokens do


def drafting_share_after_an_unlucky_start(probe_steps: int, seed: int, requests: int = 3) -> list[float]:
    """Each request's share of drafted steps, for a lone draft model at the Qwen pair's costs in
    plain steps (a K-token pass 1 + 0.08 K, a draft token 0.3, reading a token 0.04, a 150-token
    prompt read at the first draft of each request, 128 tokens a request), whose first three drafted
    steps are all rejected and the rest kept with probability 0.85 each. The reads are charged as
    the engine charges them (sync_seconds), so a probe pays them."""
    from specdec.stats import StepRecord

    rnd = random.Random(seed)
    c = DraftLengthController(max_k=8, probe_steps=probe_steps)
    drafted, shares = 0, []
    for _ in range(requests):
        c.start_sequence()
        unread, left, ks = 150, 128, []
        while left > 0:
            k = c.choose(8, upfront_seconds=0.04 * unread if drafted else 0.0, horizon=left, first_token=not ks)
            kept = 0
            while kept < k and rnd.random() < (0.0 if drafted < 3 else 0.85):
                kept += 1
            drafted += bool(k)
            c.observe(StepRecord(budget=k, drafted=k, accepted=kept, new_tokens=(), text="", draft_seconds=0.3 * k,
                                 sync_seconds=0.04 * unread if k else 0.0, target_seconds=1.0 + 0.08 * k,
                                 other_seconds=0.0))
            unread = 0 if k else unread + 1
            left -= kept + 1
            ks.append(k)
        shares.append(sum(k > 0 for k in ks) / len(ks))
    return shares


def test_a_probe_drafts_a_few_steps_once_it_has_paid_the_read():
    """Unlucky first drafts put the estimate far below break-even; a probe then pays the draft's read
    (the new request's prompt, the plain tokens since), and the budget charges it, so a probe of one
    step (two drafts) bought too little evidence and the next waited ~10 s: a 4-request bench of the
    Qwen pair decoded its T=0 prompts plainly (stop 71). A probe's next steps read nothing more: with
    three, drafting resumes in the next request on every seed."""
    seeds = range(20)
    stuck_one = sum(drafting_share_after_an_unlucky_start(1, seed)[1] < 0.2 for seed in seeds)
    stuck_three = sum(drafting_share_after_an_unlucky_start(3, seed)[1] < 0.2 for seed in seeds)
    assert stuck_one >= 2 and stuck_three == 0
