"""Drafts from a model with another tokenizer (proposers/cross_vocab.py, vocab_map.py).

- Exact proof by enumeration (float64): token-level intersection (the draft's distribution
  renormalised on the shared tokens, in target ids) followed by the unchanged rejection
  sampler gives exactly the target's joint distribution, on small random vocabularies that
  only partly overlap, with temperature and filters; not renormalising is caught.
- The two tokenizations stay in sync through accepted, rejected and bonus tokens, including
  byte-level pieces that are not UTF-8 alone (real proposer, random verdicts).
- End to end: chi-square of the engine's samples with two tiny models whose alphabets
  differ (partial overlap, ids permuted), and the wrong variant failing it; greedy and
  seeded output identical to plain decoding with char/char and BPE/BPE pairs (float64)."""
import itertools
import random
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec
import specdec.spec.proposers.cross_vocab as cross_vocab
from specdec.engine.loading import load_runner
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, final_probs
from specdec.spec.proposers.cross_vocab import CrossVocabProposer, cross_vocab_proposer, shared_distribution
from specdec.spec.proposers.vocab_map import (
    build_vocab_map,
    byte_level_alphabet,
    check_overlap,
    incomplete_tail,
    token_bytes,
    utf8_runs,
)
from specdec.spec.verify import verify_rejection

from distribution import N_QUICK, N_SLOW, TINY, p_value
from enumerate import RandomLM, enumerate_outcomes
from helpers import char_tokenizer, make_model_dir

# ---------------------------------------------------------------- vocabulary map
DRAFT_PIECES = [b"a", b"x", b"b", b"c", b"y"]  # draft ids 1 and 4 are not shared
TARGET_PIECES = [b"b", b"a", b"z", b"c"]  # target id 2 is not shared


def test_byte_level_alphabet_covers_every_byte_once():
    table = byte_level_alphabet()
    assert sorted(table.values()) == list(range(256))
    assert table["a"] == ord("a") and table["\u0120"] == ord(" ")  # GPT-2's stand-in for a space


def test_map_pairs_tokens_by_bytes_and_specials_by_text():
    vmap = build_vocab_map(DRAFT_PIECES, TARGET_PIECES)
    assert list(zip(vmap.draft_ids.tolist(), vmap.target_ids.tolist())) == [(0, 1), (2, 0), (3, 3)]
    assert vmap.target_index.tolist() == [1, 0, -1, 2]
    # a special token matches a special token of the same text, never an ordinary one
    vmap = build_vocab_map([b"<s>", b"a"], [b"a", b"<s>", b"<s>"], draft_specials={0}, target_specials={2})
    assert list(zip(vmap.draft_ids.tolist(), vmap.target_ids.tolist())) == [(0, 2), (1, 0)]


def test_byte_level_pieces_keep_their_raw_bytes(tmp_path):
    tok = TextTokenizer(make_model_dir(tmp_path / "m")).tok
    pieces = token_bytes(tok)
    text = "héllo 日本語 🙂"
    ids = tok.encode(text).ids
    assert b"".join(pieces[i] for i in ids) == text.encode()
    assert any(p and incomplete_tail(p) for p in pieces)  # pieces that are not UTF-8 alone


def test_too_small_an_overlap_is_refused_and_a_small_one_warned():
    with pytest.raises(SpecdecError, match="shares only 1 tokens.*needs at least 2"):
        check_overlap(build_vocab_map([b"a", b"q", b"r", b"s", b"t", b"u", b"v", b"w"], [b"a", b"b"]))
    with pytest.warns(UserWarning, match="shares only 3 of its 8 tokens"):
        check_overlap(build_vocab_map([b"a", b"b", b"c", b"s", b"t", b"u", b"v", b"w"], [b"a", b"b", b"c"]))


def test_a_tokenizer_that_rewrites_text_is_refused(tmp_path):
    from tokenizers import normalizers

    tok = char_tokenizer(8)
    lower = char_tokenizer(8, "abcdefG")
    lower.normalizer = normalizers.Lowercase()  # "G" comes back as "g": not the same bytes
    runner = load_runner(make_model_dir(tmp_path / "d", **TINY), "float32")
    with pytest.raises(SpecdecError, match="does not map text back"):
        cross_vocab_proposer(runner, lower, tok, 8)


# ---------------------------------------------------------------- exact enumeration
V_TARGET = len(TARGET_PIECES)
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8), dict(temperature=1.3, top_k=2)]


def wrong_shared_distribution(shared_logits, vmap, params, full_logits):
    """Not renormalising: samples from the shared tokens but hands the verifier the draft's
    full-vocabulary probabilities of them, which sum to less than 1."""
    q_full = final_probs(full_logits[None], params)[0][vmap.draft_ids]
    row = torch.zeros(vmap.target_vocab_size, dtype=q_full.dtype)
    row[vmap.target_ids] = q_full
    return q_full / q_full.sum(), row


def tli_step_distribution(target: RandomLM, draft: RandomLM, k: int, params: SamplingParams,
                          wrong: bool = False) -> dict:
    """Exact distribution of the first k+1 tokens: k drafts through TLI, one rejection-sampling
    step (the real verifier), completed by plain target sampling."""
    vmap = build_vocab_map(DRAFT_PIECES, TARGET_PIECES)
    ctx = (0,)

    def target_row(prefix: tuple) -> torch.Tensor:
        return final_probs(target(prefix).log()[None], params)[0]

    def run(rng) -> tuple:
        tokens, rows = [], []
        for _ in range(k):
            logits = draft(ctx + tuple(tokens)).log()  # the draft conditions on the target tokens
            if wrong:
                q, row = wrong_shared_distribution(logits[vmap.draft_ids], vmap, params, logits)
            else:
                q, row = shared_distribution(logits[vmap.draft_ids], vmap, params)
            j = rng.categorical(q)
            tokens.append(int(vmap.target_ids[j]))
            rows.append(row)
        target_probs = torch.stack([target_row(ctx + tuple(tokens[:i])) for i in range(k + 1)])
        verdict = verify_rejection(tokens, torch.stack(rows), target_probs, rng)
        emitted = tuple(tokens[:verdict.num_accepted]) + (verdict.next_token,)
        for _ in range(k + 1 - len(emitted)):  # plain sampling for the rest
            emitted += (rng.categorical(target_row(ctx + emitted)),)
        return emitted

    return enumerate_outcomes(run), target_row


def target_joint(target_row, n: int) -> dict:
    out = {}
    for seq in itertools.product(range(V_TARGET), repeat=n):
        prob, prefix = 1.0, (0,)
        for t in seq:
            prob *= float(target_row(prefix)[t])
            prefix += (t,)
        if prob > 0:
            out[seq] = prob
    return out


def worst_error(got: dict, want: dict) -> float:
    return max(abs(got.get(x, 0.0) - want.get(x, 0.0)) for x in set(got) | set(want))


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_token_level_intersection_is_exact(k, sparse, setting):
    params = SamplingParams(**SETTINGS[setting])
    target, draft = RandomLM(1, sparse, V_TARGET), RandomLM(2, sparse, len(DRAFT_PIECES))
    got, target_row = tli_step_distribution(target, draft, k, params)
    assert worst_error(got, target_joint(target_row, k + 1)) < 1e-9


def test_not_renormalising_is_caught():
    params = SamplingParams(temperature=1.0)
    target, draft = RandomLM(1, False, V_TARGET), RandomLM(2, False, len(DRAFT_PIECES))
    got, target_row = tli_step_distribution(target, draft, 2, params, wrong=True)
    assert worst_error(got, target_joint(target_row, 3)) > 1e-3


# ---------------------------------------------------------------- the two tokenizations in sync
@pytest.fixture(scope="module")
def bpe_pair(tmp_path_factory):
    """Byte-level BPE target (400 tokens) and draft (300 tokens), different random weights."""
    root = tmp_path_factory.mktemp("bpe")
    return make_model_dir(root / "t", seed=0), make_model_dir(root / "d", seed=1, bpe_vocab_size=300)


@pytest.mark.parametrize("mode", ["tli", "string"])
def test_the_two_tokenizations_stay_in_sync(bpe_pair, mode):
    """Random verdicts on real proposals: after every step the draft cache holds the context's
    text (then the fed drafts), although bonus tokens are often lone UTF-8 bytes."""
    target_dir, draft_dir = bpe_pair
    ttok, dtok = TextTokenizer(target_dir).tok, TextTokenizer(draft_dir).tok
    proposer = cross_vocab_proposer(load_runner(draft_dir, "float32"), dtok, ttok, ttok.get_vocab_size(), mode)
    pieces = proposer.target_pieces
    partial = [i for i, p in enumerate(pieces) if p and not utf8_runs(p)[0][1] or incomplete_tail(p)]
    ordinary = [i for i, p in enumerate(pieces) if p and i not in partial and i != 0]
    params = SamplingParams(temperature=1.0) if mode == "tli" else SamplingParams()
    rnd, gen = random.Random(0), torch.Generator().manual_seed(0)
    context = ttok.encode("héllo wörld — 日本").ids
    proposer.reset(context)
    held_back = drafted = 0
    for _ in range(80):
        proposal = proposer.propose(context, 3, params, gen)
        text = b"".join(pieces[t] for t in context)
        cached = b"".join(proposer.draft_pieces[d] for d in proposer.cached)
        assert proposer.runner.length == len(proposer.cached)
        if incomplete_tail(text):
            assert proposal.tokens == []  # an incomplete character: no drafts
            held_back += 1
        elif proposal.tokens:
            drafted += len(proposal.tokens)
            assert cached.startswith(text)
            if mode == "tli":  # the drafts fed to the draft are the proposed ones, byte for byte
                assert cached == text + b"".join(pieces[t] for t in proposal.tokens[:-1])
            else:  # string-level: the proposal is the draft's text re-encoded
                assert (cached[len(text):] + b"\xff" * 16).startswith(b"".join(pieces[t] for t in proposal.tokens)) \
                    or b"".join(pieces[t] for t in proposal.tokens).startswith(cached[len(text):])
        accepted = rnd.randint(0, len(proposal.tokens))
        bonus = rnd.choice(partial if rnd.random() < 0.3 else ordinary)
        context = context + proposal.tokens[:accepted] + [bonus]
    assert held_back > 0 and drafted > 20


# ---------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def char_pair(tmp_path_factory):
    """Target alphabet a-g; the draft's shares a-e (eos too) under other ids, and has x, y."""
    root = tmp_path_factory.mktemp("chars")
    target = make_model_dir(root / "t", seed=1, scale=1.0, **TINY)
    draft = make_model_dir(root / "d", seed=2, scale=3.0, alphabet="xcabyed", **TINY)
    return target, draft


def test_the_pair_is_drafted_across_vocabularies(char_pair):
    target, draft = char_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2, calibrate=False)
    proposer = decoder.engine.proposer
    assert isinstance(proposer, CrossVocabProposer)
    assert sorted(zip(proposer.vmap.draft_ids.tolist(), proposer.vmap.target_ids.tolist())) == \
        [(0, 0), (2, 3), (3, 1), (4, 2), (6, 5), (7, 4)]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_matches_the_target(char_pair, temperature):
    target, draft = char_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2, calibrate=False)
    assert p_value(decoder, target, dict(temperature=temperature), N_QUICK) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(temperature=1.0),
                                      dict(temperature=0.8, top_k=5, top_p=0.9)])
def test_sampling_matches_the_target_slow(char_pair, settings):
    target, draft = char_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=3, calibrate=False)
    assert p_value(decoder, target, settings, N_SLOW) > 1e-3


def test_not_renormalising_fails_the_same_test(char_pair, monkeypatch):
    def wrong(shared_logits, vmap, params):  # q handed over with the mass it had before renormalising
        q, row = shared_distribution(shared_logits, vmap, params)
        return q, row * WRONG_MASS

    monkeypatch.setattr(cross_vocab, "shared_distribution", wrong)
    target, draft = char_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2, calibrate=False)
    assert p_value(decoder, target, dict(temperature=1.0), N_QUICK) < 1e-3


WRONG_MASS = 0.7  # a typical mass of this draft on the shared tokens

PROMPTS = ["abcab", "gfedcba", "aab", "cdefgab"]
TEXT_PROMPTS = ["def add(a, b):\n", "héllo wörld — ", "class Point:\n    def", "日本語 テ"]


def assert_identical(target, draft, prompts, tokens=24, **load_options):
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", calibrate=False, **load_options)
    plain = specdec.load(target=target, method="none", dtype="float64", calibrate=False)
    accepted = drafted = 0
    for prompt in prompts:
        want = plain.generate(prompt, temperature=0, max_new_tokens=tokens, ignore_eos=True)
        got = spec.generate(prompt, temperature=0, max_new_tokens=tokens, ignore_eos=True)
        assert got.token_ids == want.token_ids, prompt
        accepted += got.stats.accepted_tokens
        drafted += got.stats.drafted_tokens
        seeded = dict(temperature=0.9, max_new_tokens=tokens, seed=3, ignore_eos=True)
        assert spec.generate(prompt, **seeded).token_ids == plain.generate(prompt, **seeded).token_ids, prompt
    return accepted, drafted


def derive_draft(target: Path, draft: Path, noise: float, seed: int = 0) -> Path:
    """Give draft (another tokenizer, same architecture) the target's weights: each shared
    token's rows come from the target token with its bytes, then noise * N(0, std) on every
    weight. noise=0: the target itself under other ids."""
    ttok, dtok = TextTokenizer(target).tok, TextTokenizer(draft).tok
    vmap = build_vocab_map(token_bytes(dtok), token_bytes(ttok))
    state, own = load_file(str(target / "model.safetensors")), load_file(str(draft / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = own[name].clone()
        rows[vmap.draft_ids] = state[name][vmap.target_ids]
        state[name] = rows
    g = torch.Generator().manual_seed(seed)
    for name, w in state.items():
        if noise and w.dim() >= 1:
            state[name] = w + noise * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype)
    save_file({k: v.contiguous() for k, v in state.items()}, str(draft / "model.safetensors"),
              metadata={"format": "pt"})
    return draft


def test_a_draft_equal_to_the_target_under_other_ids_is_always_accepted(tmp_path):
    """The target's own weights behind a permuted alphabet: every TLI draft must be accepted,
    which fails if the two tokenizations drift apart or ids are mapped wrong."""
    target = make_model_dir(tmp_path / "t", seed=5, **TINY)
    draft = derive_draft(target, make_model_dir(tmp_path / "d", seed=6, alphabet="gfedcba", **TINY), noise=0)
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", calibrate=False,
                        draft_tokens=4, cross_vocab="tli", tree_lookup=False)  # the draft's own tokens only
    result = spec.generate("abcab", temperature=0, max_new_tokens=40, ignore_eos=True)
    assert result.stats.drafted_tokens > 0 and result.stats.accepted_tokens == result.stats.drafted_tokens


@pytest.fixture(scope="module")
def near_char_pair(tmp_path_factory, char_pair):
    """The char pair's alphabets, the draft made from the target's weights plus noise: it
    agrees often, not always (accepted and rejected drafts both happen)."""
    target, _ = char_pair
    root = tmp_path_factory.mktemp("near")
    return target, derive_draft(target, make_model_dir(root / "d", seed=2, alphabet="xcabyed", **TINY), noise=0.5)


@pytest.mark.parametrize("mode", ["auto", "tli"])
def test_greedy_output_is_plain_decoding_char_pair(near_char_pair, mode):
    target, draft = near_char_pair
    accepted, drafted = assert_identical(target, draft, PROMPTS, cross_vocab=mode, draft_tokens=3)
    assert 0 < accepted < drafted


@pytest.fixture(scope="module")
def near_bpe_pair(tmp_path_factory, bpe_pair):
    target, _ = bpe_pair
    root = tmp_path_factory.mktemp("nearbpe")
    # the target's weights, but the draft sees its own (shorter) tokens: it agrees rarely
    return target, derive_draft(target, make_model_dir(root / "d", seed=1, bpe_vocab_size=300), noise=0)


@pytest.mark.parametrize("mode", ["auto", "tli"])
def test_greedy_output_is_plain_decoding_bpe_pair(near_bpe_pair, mode):
    target, draft = near_bpe_pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 300 of 300 draft tokens shared: no warning
        accepted, drafted = assert_identical(target, draft, TEXT_PROMPTS, cross_vocab=mode,
                                             draft_tokens=3)
    assert 0 < accepted < drafted


@pytest.mark.parametrize("mode", ["auto", "tli"])
def test_cross_vocab_drafts_in_a_batch_equal_plain_decoding(near_bpe_pair, mode):
    """A draft with another tokenizer in continuous batching: each sequence drafts with its
    own fork (its own cache and tokenizations); greedy and seeded requests, mixed with plain
    and prompt-lookup ones in 3 slots, give plain decoding's tokens."""
    target, draft = near_bpe_pair
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", draft_tokens=3,
                        cross_vocab=mode, calibrate=False)
    plain = specdec.load(target=target, dtype="float64", calibrate=False)
    prompts, samplings = [], []
    for i, prompt in enumerate(TEXT_PROMPTS * 2):
        sampling = dict(max_new_tokens=10 + 3 * i, ignore_eos=True)
        if i % 2:
            sampling.update(temperature=0.8, seed=40 + i)
        prompts.append(prompt)
        samplings.append(dict(sampling, method=("draft", "none", "ngram")[i % 3] if i < 6 else "draft"))
    got = spec.generate_batch(prompts, samplings, max_batch=3)
    for g, prompt, s in zip(got, prompts, samplings):
        want = plain.generate(prompt, **{k: v for k, v in s.items() if k != "method"}).token_ids
        assert g.token_ids == want, (prompt, s)
    drafted = [g for g, s in zip(got, samplings) if s["method"] == "draft"]
    assert 0 < sum(g.stats.accepted_tokens for g in drafted) < sum(g.stats.drafted_tokens for g in drafted)


@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_specdec_verify_checks_a_cross_vocab_pair(char_pair, capsys, temperature):
    import json

    from specdec.cli.main import main

    target, draft = char_pair
    greedy = temperature == "0"
    code = main(["verify", "--target", str(target), "--draft", str(draft), "--method", "draft", "--prompt", "abcab",
                 "--temperature", temperature, "--samples", "1" if greedy else "800",
                 "--tokens", "20" if greedy else "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    if greedy:
        assert report["identical"] == 1
    else:
        assert report["drafted_tokens"] > 0 and report["distinct_outcomes"] > 10


def test_bench_runs_both_cross_vocab_variants(near_char_pair):
    from contextlib import ExitStack

    from specdec.bench.methods import make_runner

    target, draft = near_char_pair
    setup = dict(target=target, draft=draft, dtype="float32", heads={}, draft_tokens=3)
    tokenizer = TextTokenizer(target)
    with ExitStack() as stack:
        for method in ("draft", "draft@tli"):
            runner = make_runner(method, setup, stack, tokenizer)
            assert runner.decoder.engine.proposer.mode == ("tli" if method == "draft@tli" else "auto")
            stats = runner.run("abcab", 0.0, 16, 0)
            assert stats.new_tokens == 16 and stats.drafted_tokens > 0


def test_penalised_sampling_drafts_without_the_penalties(char_pair):
    """Penalties and logit biases count target ids; the draft proposes without them, and the
    target's rows carry them (any proposal distribution keeps rejection sampling exact)."""
    target, draft = char_pair
    decoder = specdec.load(target=target, draft=draft, method="draft", draft_tokens=2, calibrate=False)
    settings = dict(temperature=1.0, presence_penalty=0.8, repetition_penalty=1.3, logit_bias={3: 2.0})
    assert p_value(decoder, target, settings, N_QUICK) > 1e-3


def test_bench_peer_runs_universal_assisted_generation(near_bpe_pair):
    """hf-assisted with a draft of another vocabulary size is transformers' UAG (both tokenizers
    given; transformers tells tokenizers apart by vocabulary size). Greedy only here: at T > 0
    transformers 5.24 fails when the draft's vocabulary is a subset of the target's, as this
    pair's is (AssistantToTargetTranslator.assistant_overlap_token_ids is never set); with
    SmolLM2 and pycode-draft both temperatures run."""
    pytest.importorskip("transformers")
    from specdec.bench.peers import TransformersPeer

    target, draft = near_bpe_pair
    peer = TransformersPeer("hf-assisted", target, draft, TextTokenizer(target))
    assert set(peer.tokenizers) == {"tokenizer", "assistant_tokenizer"}
    assert peer.run("def add(a, b):\n", 0.0, 8, 0).new_tokens == 8


def test_a_draft_with_a_shorter_window_slides_it_when_full(tmp_path, char_pair):
    """The draft's own tokens can outgrow its window before the target's context does: it then
    drafts from the text's tail (no cache overflow), and output stays the target's."""
    target, _ = char_pair
    small = dict(TINY, max_pos=12)
    draft = make_model_dir(tmp_path / "d", seed=2, alphabet="xcabyed", **small)
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", draft_tokens=3)
    plain = specdec.load(target=target, dtype="float64", calibrate=False)
    want = plain.generate("abcab", temperature=0, max_new_tokens=20, ignore_eos=True).token_ids
    got, drafted_early, drafted_late = [], 0, 0
    for chunk in spec.stream("abcab", temperature=0, max_new_tokens=20, ignore_eos=True):
        if chunk.step is not None:  # the draft's context (one char, one token) before this step
            if 5 + len(got) + 1 >= 12:
                drafted_late += chunk.step.drafted
            else:
                drafted_early += chunk.step.drafted
        got += chunk.token_ids
    assert got == want and drafted_early > 0 and drafted_late > 0
    assert spec.engine.proposer.runner.length < 12


def test_a_batched_cross_vocab_draft_reads_its_prompt_at_its_first_draft(near_bpe_pair):
    """In a batch the draft model prefills a sequence's prompt when the sequence first drafts,
    not when it joins: the batch's gate may keep it to plain steps all along (16 clients on
    SmolLM2: 0.5 s of a 30 s run went to draft prefills that never drafted)."""
    target, draft = near_bpe_pair
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", draft_tokens=3,
                        calibrate=False)
    batch = spec.scheduler(2)
    seq = batch.add(TEXT_PROMPTS[0], SamplingParams(max_new_tokens=8, ignore_eos=True), "draft")
    fork = batch.entries[0].proposer
    assert fork.cached == []
    batch.step()  # the prompt's prefill, then the first step that may draft (K is fixed: no gate)
    assert len(fork.cached) >= len(TEXT_PROMPTS[0]) // 4  # the prompt, read now
    while seq.stats.drafted_tokens == 0 and seq.finish_reason is None:
        batch.step()
    assert seq.stats.drafted_tokens > 0


def test_greedy_drafts_hold_the_lookup_chain_by_default_with_another_tokenizer_only(near_bpe_pair):
    """tree_lookup=None (the default) grafts the prompt-lookup chain onto a cross-vocabulary
    draft's greedy drafts (measured faster on SmolLM2) but not onto a same-tokenizer draft's
    (measured slower with Qwen2.5-Coder's 0.5B); True / False decide for both."""
    import specdec.models.bundled as bundled

    target, draft = near_bpe_pair
    lookup = {(name, setting): specdec.load(target=t, draft=d, method="draft", dtype="float64", calibrate=False,
                                            tree_lookup=setting).engine.proposer.lookup is not None
              for name, t, d in [("cross", target, draft), ("same", bundled.DEFAULT_TARGET, bundled.DEFAULT_DRAFT)]
              for setting in (None, True, False)}
    assert lookup == {("cross", None): True, ("cross", True): True, ("cross", False): False,
                      ("same", None): False, ("same", True): True, ("same", False): False}


def test_past_the_drafts_window_it_drafts_from_the_recent_text(tmp_path):
    """A draft with a shorter window than the prompt (SmolLM2's 1,024-token draft under a long
    file) drafts from the text's tail, read again as its window slides; outputs stay the target's."""
    target = make_model_dir(tmp_path / "t", seed=5, **{**TINY, "max_pos": 256})
    draft = derive_draft(target, make_model_dir(tmp_path / "d", seed=6, alphabet="gfedcba", **{**TINY, "max_pos": 24}),
                         noise=0)
    accepted, drafted = assert_identical(target, draft, ["abcabcaab" * 7, "gfedcba" * 9], tokens=60, draft_tokens=3,
                                         cross_vocab="tli", tree_lookup=False)
    assert drafted > 20 and accepted > 0
