"""Continuous batching (specdec/engine/scheduler.py, models/batch.py): a sequence's output does not
depend on what else is in the batch. Greedy and seeded outputs equal the same requests run
alone through Engine (float64; bfloat16 in exact mode), also while sequences join and leave;
sampled outputs keep the target's exact distribution with several temperatures in one batch
(chi-square)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec
import specdec.engine.verdicts
from specdec.engine.requests import generate_all, stream_chunks
from specdec.engine.scheduler import Scheduler
from specdec.errors import SpecdecError
from specdec.models.batch import BatchRunner
from specdec.models.cache import PassPlan
from specdec.sampling import SamplingParams
from specdec.spec.control.batch_width import BatchDraftLength, CostTable
from specdec.spec.verify import ChainVerdict

from distribution import N_QUICK, NEW, PROMPT, interleaved_p_values, tiny_model_dir
from helpers import make_model_dir

REPEAT = "def add(a, b):\n    return a + b\n"
PROMPTS = [REPEAT * 3 + "def add", "class Point:\n", "for i in range(10):\n    print(i", "x",
           REPEAT * 6, "héllo wörld", "class", "for i in range(10):\n    print(i * i)\n" * 2]
MAX_TOKENS = [40, 7, 25, 33, 12, 40, 18, 29]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("batch"), layers=2, kv_heads=2)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """The target's weights scaled down: a related draft that agrees often, not always."""
    return make_model_dir(tmp_path_factory.mktemp("batch-draft"), layers=2, kv_heads=2, scale=0.8)


METHODS = ("none", "ngram", "draft")


@pytest.fixture(scope="module")
def decoders(model_dir, draft_dir):
    """float64 decoders by method; K fixed so ngram drafts whenever it finds a match (drafts
    of several lengths, padded, share each pass). The draft decoder's batch offers every
    method: it runs the batches."""
    return {m: specdec.load(target=model_dir, draft=draft_dir if m == "draft" else None, dtype="float64",
                            method=m, draft_tokens=4, calibrate=False) for m in METHODS}


def requests_with_stops(decoder, **sampling) -> list[dict]:
    """Mixed methods and max tokens; a third of the requests get a stop string taken from the
    middle of their own single-run output, so the stop rule really fires mid-generation."""
    out = []
    for i, (prompt, max_tokens) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        s = dict(sampling, max_new_tokens=max_tokens, method=METHODS[i % 3])
        text = ""
        if i % 4 == 0:
            text = decoder.generate(prompt, **sampling, max_new_tokens=max_tokens).text
        if len(text) >= 4:
            s["stop"] = [text[len(text) // 2:len(text) // 2 + 2]]
        out.append(s)
    return out


def alone(decoders, prompt, sampling: dict):
    s = dict(sampling)
    return decoders[s.pop("method")].generate(prompt, **s)


def test_batched_pass_equals_single_passes(model_dir):
    """Rows of different widths (padding), per-slot positions and rollback: each slot's logits
    are those of its own sequence run alone."""
    decoder = specdec.load(target=model_dir, dtype="float64", calibrate=False)
    single, model = decoder.engine.target, decoder.engine.target.model
    batch = BatchRunner(model, 4, 64)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1]]
    for slot, p in enumerate(prompts):
        if len(p) > 1:
            batch.extend_slot(slot, p[:-1])
    rows = [[p[-1]] + [20, 21, 22][:slot] for slot, p in enumerate(prompts)]
    got = batch.forward(PassPlan(rows))
    batch.rollback(2, len(prompts[2]) + 1)  # slot 2 keeps its context and one of its two drafts
    got_next = batch.forward(PassPlan([[30], [31], [32, 33], [34]]))
    for slot, p in enumerate(prompts):
        single.reset()
        want = single.extend(p[:-1] + rows[slot])[len(p) - 1:]
        torch.testing.assert_close(got[slot], want, rtol=0, atol=1e-12)
        rolled_back = 1 if slot == 2 else 0
        assert batch.length(slot) == len(p) - 1 + len(rows[slot]) - rolled_back + len(got_next[slot])
    single.reset()
    want = single.extend(prompts[2][:-1] + rows[2][:2] + [32, 33])[-2:]
    torch.testing.assert_close(got_next[2], want, rtol=0, atol=1e-12)


def test_greedy_batch_equals_each_request_alone(decoders):
    """8 requests with mixed prompt lengths, max tokens, stop strings and methods: the batch
    (all at once; and 3 slots, requests joining as others finish; and prompts prefilled in
    chunks of 8 tokens) gives every request exactly its single-sequence output."""
    samplings = requests_with_stops(decoders["none"])
    want = [alone(decoders, p, s) for p, s in zip(PROMPTS, samplings)]
    assert any(w.finish_reason == "stop" for w in want) and any(w.finish_reason == "length" for w in want)
    decoder = decoders["draft"]
    for max_batch in (8, 3):
        got = decoder.generate_batch(PROMPTS, samplings, max_batch=max_batch)
        for g, w, s in zip(got, want, samplings):
            assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason), s
        for method in ("ngram", "draft"):
            assert sum(g.stats.accepted_tokens for g, s in zip(got, samplings) if s["method"] == method) > 0
        assert all(g.stats.drafted_tokens == 0 for g, s in zip(got, samplings) if s["method"] == "none")
    chunked = Scheduler(decoder.engine, max_batch=4, prefill_chunk=8)
    got = generate_all(chunked, [(p, decoder.sampling_params(**{k: v for k, v in s.items() if k != "method"}),
                                  s["method"]) for p, s in zip(PROMPTS, samplings)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_seeded_batch_equals_plain_seeded_sampling(decoders):
    """seed + temperature 0.8 (seed_mode invariant): every request in the batch, whatever its
    method, gives plain decoding's seeded tokens."""
    samplings = [dict(method=METHODS[i % 3], max_new_tokens=m, seed=100 + i, temperature=0.8)
                 for i, m in enumerate(MAX_TOKENS)]
    got = decoders["draft"].generate_batch(PROMPTS, samplings, max_batch=5)
    for prompt, s, g in zip(PROMPTS, samplings, got):
        s = {k: v for k, v in s.items() if k != "method"}
        assert g.token_ids == decoders["none"].generate(prompt, **s).token_ids
    assert sum(g.stats.accepted_tokens for g, s in zip(got, samplings) if s["method"] == "draft") > 0


def test_exact_mode_bfloat16_batch_equals_alone(model_dir, draft_dir):
    """bfloat16 in exact mode: each row of a batched pass gets a 1-token pass's bits, so greedy
    batch output equals plain decoding alone (without exact mode it does not on this model)."""
    batched = specdec.load(target=model_dir, draft=draft_dir, dtype="bfloat16", method="draft", draft_tokens=4,
                           calibrate=False)
    plain = specdec.load(target=model_dir, dtype="bfloat16", calibrate=False)
    assert batched.exact and plain.exact
    samplings = [dict(method=METHODS[i % 3], max_new_tokens=48) for i in range(len(PROMPTS))]
    got = batched.generate_batch(PROMPTS, samplings, max_batch=8)
    assert [g.token_ids for g in got] == [plain.generate(p, max_new_tokens=48).token_ids for p in PROMPTS]


def test_sequences_join_and_leave_between_steps(decoders):
    """Start 3, add 2 after a few steps, cancel one: the slot is freed (and reused), and the
    other sequences' outputs are their single-run outputs."""
    engine = Scheduler(decoders["draft"].engine, max_batch=5)
    params = [SamplingParams(max_new_tokens=30), SamplingParams(max_new_tokens=30, temperature=0.8, seed=3),
              SamplingParams(max_new_tokens=30), SamplingParams(max_new_tokens=20),
              SamplingParams(max_new_tokens=25, temperature=0.8, seed=9)]
    methods = ["draft", "ngram", "draft", "none", "draft"]
    seqs = [engine.add(PROMPTS[i], params[i], methods[i]) for i in range(3)]
    for _ in range(3):
        engine.step()
    assert all(len(s.generated) > 0 for s in seqs) and len(engine) == 3
    seqs += [engine.add(PROMPTS[i], params[i], methods[i]) for i in (3, 4)]
    assert engine.free_slots == 0
    with pytest.raises(SpecdecError):
        engine.add("x", SamplingParams())
    engine.cancel(seqs[1])  # not the last slot: the last sequence moves into its slot
    assert len(engine) == 4 and engine.free_slots == 1
    seqs.append(engine.add(PROMPTS[4], params[4], "ngram"))  # the freed slot is taken again
    assert engine.free_slots == 0
    done = {}
    while len(engine):
        for event in engine.step():
            if event.seq.finish_reason is not None:
                done[id(event.seq)] = engine.finish(event.seq)[0]
    assert id(seqs[1]) not in done and len(done) == 5
    for seq, i in zip([seqs[0], seqs[2], seqs[3], seqs[4], seqs[5]], (0, 2, 3, 4, 4)):
        p = params[i]
        want = decoders["none"].generate(PROMPTS[i], max_new_tokens=p.max_new_tokens, temperature=p.temperature,
                                         seed=p.seed)
        assert done[id(seq)].token_ids == want.token_ids


def test_unbatched_method_is_refused(decoders):
    engine = Scheduler(decoders["none"].engine, max_batch=2)
    with pytest.raises(SpecdecError, match="not batched"):
        engine.add("x", SamplingParams(), method="draft")  # the decoder has no draft model
    with pytest.raises(SpecdecError, match="not batched"):
        decoders["draft"].generate_batch(["x"], [dict(method="eagle")])


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A target with broad distributions and a confident draft that disagrees with it (many
    rejections: a verifier that mishandles q shows within a few thousand samples)."""
    return (tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=1, scale=0.5),
            tiny_model_dir(tmp_path_factory.mktemp("tiny-draft"), seed=2, scale=3.0))


SEED_BASE = 10 ** 6


def batched_p_values(tiny_dirs, method: str) -> list[float]:
    """Sequences at two temperatures (and top-p on one) share every batch of 16 (rejection
    sampling, K=2): p-values of the first NEW tokens of each setting against the target's
    exact joint distribution at that setting."""
    target, draft = tiny_dirs
    settings = [dict(temperature=0.6), dict(temperature=1.3, top_p=0.95)]
    decoder = specdec.load(target=target, draft=draft if method == "draft" else None,
                           method="draft" if method == "draft" else "ngram", draft_tokens=2, calibrate=False)
    # any fixed seeds do: under the null the p-values are uniform. Seeds 0.. gave 0.0004 at T=0.6
    # for ngram once sample() changed its draws (seed sets 1-5: 0.07-0.41), so these start at 10^6
    requests = [(PROMPT, SamplingParams(max_new_tokens=NEW, seed=SEED_BASE + seed, seed_mode="rejection",
                                        ignore_eos=True, **settings[seed % 2]), method) for seed in range(2 * N_QUICK)]
    results = generate_all(Scheduler(decoder.engine, max_batch=16), requests)
    drafted = sum(r.stats.drafted_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    assert (0 < accepted < drafted) if method != "none" else drafted == 0
    return interleaved_p_values(results, settings, target)


@pytest.mark.parametrize("method", ["draft", "ngram", "none"])
def test_batched_sampling_keeps_each_temperature_distribution(tiny_dirs, method):
    assert min(batched_p_values(tiny_dirs, method)) > 1e-3


def test_a_wrong_verifier_fails_the_batched_test(tiny_dirs, monkeypatch):
    """Power: rejection sampling that forgets to divide by q fails the same check."""
    def wrong_verifier(drafts, draft_probs, target_probs, rng):
        for i, x in enumerate(drafts):
            if not rng.coin(float(target_probs[i, x])):
                return ChainVerdict(i, rng.categorical(target_probs[i]))
        return ChainVerdict(len(drafts), rng.categorical(target_probs[len(drafts)]))

    monkeypatch.setattr(specdec.engine.verdicts, "verify_rejection", wrong_verifier)
    assert min(batched_p_values(tiny_dirs, "draft")) < 1e-3


def test_stream_chunks_and_logprobs_equal_engine_stream(decoders):
    """Per step, the batch hands out the chunks a lone stream (a batch of one) yields (text held back for
    stop strings, the final chunk, logprobs and prompt logprobs), penalties applied per row."""
    decoder = decoders["draft"]
    cases = [(PROMPTS[0], dict(max_new_tokens=20, logprobs=2, prompt_logprobs=1), "draft"),
             (PROMPTS[1], dict(max_new_tokens=15, presence_penalty=0.8, repetition_penalty=1.3), "ngram"),
             (PROMPTS[2], dict(max_new_tokens=25, logprobs=0, frequency_penalty=0.5), "none"),
             (PROMPTS[4], dict(max_new_tokens=30, temperature=0.8, seed=4, logit_bias={5: 3.0}), "draft")]
    stop = decoders["none"].generate(cases[2][0], **cases[2][1]).text[6:8]
    cases[2][1]["stop"] = [stop]

    def rounded(entries):  # float64 passes of other widths round the last bits differently
        return None if entries is None else [
            None if e is None else (e.token, round(e.logprob, 9), tuple((t, round(v, 9)) for t, v in e.top))
            for e in entries]

    def key(chunk):
        result = chunk.result
        return (chunk.text, chunk.token_ids, rounded(chunk.token_logprobs), rounded(chunk.prompt_logprobs),
                None if result is None else (result.text, result.token_ids, result.finish_reason))

    engine = Scheduler(decoder.engine, max_batch=4)
    seqs = [engine.add(p, decoder.sampling_params(**kw), m) for p, kw, m in cases]
    got = {id(s): [] for s in seqs}
    while len(engine):
        for event in engine.step():
            got[id(event.seq)] += [key(c) for c in stream_chunks(engine, event)]
    for seq, (prompt, kw, method) in zip(seqs, cases):
        want = [key(c) for c in decoders[method].stream(prompt, **kw)]
        if method == "none":  # the stop string fired
            assert want[-1][-1][2] == "stop"
        assert got[id(seq)] == want


def test_batch_k_shrinks_as_verification_stops_being_free():
    """The batch's K from measured pass costs: drafts while a pass over more rows costs little,
    fewer drafts as the batch widens the pass, plain steps when every row costs as much as a
    plain step (with an occasional probe where a pass has a fixed cost: drafts accepted would
    pay); sequences that cannot draft weigh nothing (rows are packed: a lone drafter pays for
    its own rows only)."""
    def table(base: float, per_row: float) -> BatchDraftLength:
        width = BatchDraftLength()
        for rows in (1, 2, 4, 8, 16, 32, 64):
            width.target.observe(rows, base + per_row * rows)
        return width

    def expected(a: float):
        return lambda k: (1 - a ** (k + 1)) / (1 - a)

    memory_bound = table(base=10e-3, per_row=0.1e-3)  # SmolLM2-like on a CPU: weights dominate
    ks = [memory_bound.choose([8] * n, [expected(0.7)] * n, 64 // n - 1) for n in (1, 4, 16, 32)]
    assert ks[0] >= 3 and ks == sorted(ks, reverse=True) and ks[-1] < ks[0]
    assert memory_bound.choose([0] * 4, [expected(0.7)] * 4, 15) == 0  # nobody can draft
    one_drafter = memory_bound.choose([8] + [0] * 15, [expected(0.7)] * 16, 3)
    all_draft = memory_bound.choose([8] * 16, [expected(0.7)] * 16, 3)
    assert one_drafter >= all_draft
    # a pass with some fixed cost: drafts would pay if accepted, so plain steps still probe now and then
    some_fixed = table(base=2e-3, per_row=1e-3)
    picks = [some_fixed.choose([8] * 4, [expected(0.05)] * 4, 15) for _ in range(some_fixed.probe_every)]
    assert picks[:-1] == [0] * (len(picks) - 1) and picks[-1] == some_fixed.probe_k
    # every row costs a plain step's: no acceptance could make a draft pay, so never a probe
    compute_bound = table(base=0.0, per_row=1e-3)
    picks = [compute_bound.choose([8] * 4, [expected(0.99)] * 4, 15) for _ in range(3 * compute_bound.probe_every)]
    assert picks == [0] * len(picks)
    assert CostTable({4: 1.0, 8: 2.0}).estimate(6) == 1.5 and CostTable({4: 1.0, 8: 2.0}).estimate(16) == 4.0
    assert CostTable({4: 1.0}).estimate(8) is None


def test_uncalibrated_batch_k_measures_two_sizes_before_choosing():
    """Without calibration the batch's K starts from nothing: plain steps until a plain pass is
    timed (the first pass of a size only builds kernels), then probes until a second size is,
    then chosen from the costs; never an estimate from one size."""
    width = BatchDraftLength()
    costs = {}  # rows -> seconds, as a memory-bound pass
    picks = []
    for _ in range(8):
        k = width.choose([8] * 4, [lambda k: (1 - 0.7 ** (k + 1)) / 0.3] * 4, 7)
        picks.append(k)
        rows = 4 * (k + 1)
        width.observe(rows, costs.setdefault(rows, 10e-3 + 0.1e-3 * rows))
    assert picks[:4] == [0, 0, 2, 2] and min(picks[4:]) > 0, picks


@pytest.fixture(scope="module")
def deep_dir(model_dir, tmp_path_factory):
    """model_dir with 4 more layers that add nothing to the residual stream (zero output
    projections): the same greedy tokens at 3x the layers, so model_dir drafts for it cheaply
    and is always right."""
    path = tmp_path_factory.mktemp("batch-deep")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(model_dir / name, path / name)
    weights = load_file(str(model_dir / "model.safetensors"))
    for layer in range(2, 6):
        for key, value in list(weights.items()):
            if key.startswith("model.layers.1."):
                zero = key.endswith(("o_proj.weight", "down_proj.weight"))
                weights[key.replace(".1.", f".{layer}.", 1)] = torch.zeros_like(value) if zero else value.clone()
    save_file(weights, str(path / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text()) | {"num_hidden_layers": 6}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_adaptive_batch_k_keeps_greedy_output(model_dir, deep_dir, decoders):
    """Without a fixed K (the batch chooses it; calibrated at load), outputs are unchanged. A
    draft with a third of the target's layers that always agrees: drafting would pay, so the
    batch probes it (an estimate of acceptance starts unsure) and then drafts."""
    decoder = specdec.load(target=deep_dir, draft=model_dir, dtype="float64", method="draft")
    samplings = [dict(method=METHODS[i % 3], max_new_tokens=m) for i, m in enumerate(MAX_TOKENS)]
    got = decoder.generate_batch(PROMPTS, samplings, max_batch=4)
    assert decoder.scheduler(4).drafting.width.target.seconds  # calibrated, then measured
    assert sum(g.stats.accepted_tokens for g, s in zip(got, samplings) if s["method"] == "draft") > 0
    assert [g.token_ids for g in got] == [decoders["none"].generate(p, max_new_tokens=m).token_ids
                                          for p, m in zip(PROMPTS, MAX_TOKENS)]
