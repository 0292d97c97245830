"""A lone request runs through the same loop as a batch (engine/scheduler.py), as a batch of one on
the decoder's own runner, for every backend and method."""
import pytest

import specdec
from specdec.errors import SpecdecError

from helpers import make_model_dir, on_the_stack


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("one_loop"), layers=2, kv_heads=1)


def test_a_lone_stream_holds_the_one_slot_until_closed(model_dir):
    decoder = specdec.load(target=model_dir, method="ngram")
    alone = decoder.scheduler(1)
    stream = decoder.stream("def f(x):\n    return x", max_new_tokens=30, temperature=0)
    next(stream)
    assert len(alone) == 1 and alone.entries[0].proposer is decoder.engine.proposer
    with pytest.raises(SpecdecError, match="busy"):  # one lone request at a time
        next(decoder.stream("def", max_new_tokens=3))
    stream.close()  # the client went away: its slot is free again
    assert len(alone) == 0
    want = specdec.load(target=model_dir).generate("def g(y):", max_new_tokens=12, temperature=0)
    assert decoder.generate("def g(y):", max_new_tokens=12, temperature=0).token_ids == want.token_ids


@pytest.mark.parametrize("backend", ["native", "transformers"])
def test_each_backend_runs_lone_requests_through_the_loop(model_dir, backend):
    """The batch of one wraps any runner (models/one_slot.py): plain, prompt lookup and a draft
    model give the same greedy tokens on either backend. K is fixed so that the draft drafts: a
    draft as large as its target never repays reading the prompt in 24 tokens, and the
    controller would rightly keep to plain steps (test_draft_read_gate.py)."""
    plain = specdec.load(target=model_dir, dtype="float64", backend=backend)
    want = plain.generate("for i in range(10):\n    ", max_new_tokens=24, temperature=0).token_ids
    for method in ("ngram", "draft"):
        extra = {"draft": model_dir, "draft_tokens": 4} if method == "draft" else {}
        spec = specdec.load(target=model_dir, dtype="float64", backend=backend, method=method, **extra)
        result = spec.generate("for i in range(10):\n    ", max_new_tokens=24, temperature=0)
        assert result.token_ids == want, (backend, method)
        assert result.stats.drafted_tokens > 0
        assert len(spec.scheduler(1)) == 0


def test_a_cancelled_stream_leaves_its_prompt_rows_for_the_next_request(model_dir):
    """An editor cancels a completion as the user types on: the next request, which shares the
    text before the cursor, reuses those cache rows (the slot is left as the last step left it)."""
    decoder = on_the_stack(specdec.load(target=model_dir))
    prompt = "def f(x):\n    return x + 1\n\n\ndef g(y):\n"
    stream = decoder.stream(prompt, max_new_tokens=30, temperature=0, ignore_eos=True)
    next(stream)
    next(stream)
    stream.close()
    got = decoder.generate(prompt + "    return", max_new_tokens=12, temperature=0)
    assert got.stats.cached_prompt_tokens >= len(decoder.tokenizer.encode(prompt)) - 2
    fresh = specdec.load(target=model_dir).generate(prompt + "    return", max_new_tokens=12, temperature=0)
    assert got.token_ids == fresh.token_ids and fresh.stats.cached_prompt_tokens == 0


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft", "ngram"])
def test_a_drafting_request_leaves_its_prompt_rows_for_the_next_request(method):
    """Prefix reuse after speculative steps: a last step's drafts kept past max_tokens leave the
    cache at release (they kept every later prompt from reusing it), and EAGLE's head reads the
    kept prefix's target features from the last request. Output as without reuse."""
    warm = on_the_stack(specdec.load(method=method, dtype="bfloat16", memory=False))
    fresh = specdec.load(method=method, dtype="bfloat16", memory=False, reuse_prefix=False)
    prompt = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fib"
    prompt_tokens, drafted = len(warm.tokenizer.encode(prompt)), 0
    for i, tokens in enumerate((13, 7, 20, 9)):
        for sampling in (dict(temperature=0), dict(temperature=1.0, seed=5)):
            got = warm.generate(prompt, max_new_tokens=tokens, **sampling)
            want = fresh.generate(prompt, max_new_tokens=tokens, **sampling)
            assert got.token_ids == want.token_ids and want.stats.cached_prompt_tokens == 0
            assert got.stats.cached_prompt_tokens == (0 if i == 0 and sampling["temperature"] == 0
                                                      else prompt_tokens - 1), (tokens, sampling)
            drafted += got.stats.drafted_tokens
    assert drafted > 0


def test_eagle_keeps_its_head_rows_of_a_reused_prefix_and_drafts_as_after_a_fresh_read():
    """A 4-bit head's rows have the same bits in any pass, so the rows of a reused prefix stay in
    its cache (not read again at the first draft) and the drafts are a fresh decoder's."""
    warm = specdec.load(method="eagle", dtype="bfloat16", memory=False, draft_tokens=4)
    fresh = specdec.load(method="eagle", dtype="bfloat16", memory=False, draft_tokens=4, reuse_prefix=False)
    assert warm.engine.proposer.head.row_invariant
    prompt = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fact"
    first = warm.generate(prompt, max_new_tokens=12)
    proposer, reads = warm.engine.proposer, []
    feed = proposer._feed
    proposer._feed = lambda feats, context: (reads.append(feats.shape[0]), feed(feats, context))[1]
    got = warm.generate(prompt + first.text, max_new_tokens=12)
    want = fresh.generate(prompt + first.text, max_new_tokens=12)
    assert got.token_ids == want.token_ids and got.stats.cached_prompt_tokens > 0
    assert (got.stats.drafted_tokens, got.stats.accepted_tokens) == (want.stats.drafted_tokens,
                                                                     want.stats.accepted_tokens)
    assert got.stats.drafted_tokens > 0 and reads[0] < got.stats.cached_prompt_tokens  # the kept rows not read again
