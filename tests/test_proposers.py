"""Drafters keep their own state in sync with the context they are handed."""
import random

import torch

from specdec.models.checkpoint import load_native
from specdec.models.runner import NativeRunner
from specdec.sampling import SamplingParams
from specdec.spec.proposers.draft_model import DraftModelProposer

from helpers import make_model_dir


def test_draft_cache_follows_accepts_rejections_and_plain_steps(tmp_path):
    """After any history of partly accepted drafts and plain steps, the draft model proposes
    exactly what a freshly prefilled draft model proposes for the same context."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24), "float64")
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(0)
    proposer = DraftModelProposer(NativeRunner(model))
    context = [rng.randrange(1, 24) for _ in range(6)]
    proposer.reset(context)
    for _ in range(30):
        k = rng.randrange(0, 5)  # 0: a plain step, the drafter is not asked
        fresh = DraftModelProposer(NativeRunner(model))
        fresh.reset(context)
        if k:
            got = proposer.propose(context, k, greedy, None).tokens
            assert got == fresh.propose(context, k, greedy, None).tokens
            kept = rng.randrange(0, len(got) + 1)  # the target keeps a prefix, then adds its own
            context += got[:kept] + [rng.randrange(1, 24)]
        else:
            context += [rng.randrange(1, 24) for _ in range(rng.randrange(1, 4))]


def test_a_draft_model_reads_its_prompt_at_its_first_draft_keeping_a_reusable_prefix(tmp_path):
    """reset() computes nothing (a request that never drafts never pays the draft's prefill);
    the first draft catches up on the whole context and drafts what an eagerly prefilled draft
    drafts; a next prompt keeps the prefix the cache holds (prefix reuse) and reads only the rest."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24), "float32")
    greedy = SamplingParams(temperature=0.0)
    proposer = DraftModelProposer(NativeRunner(model))
    assert proposer.runner.kv_rows_invariant  # the cache's rows are what a fresh prefill writes
    prompt = [3, 7, 1, 9, 4, 4, 12, 5]
    proposer.reset(prompt)
    assert proposer.runner.length == 0 and proposer.cached == []
    proposal = proposer.propose(prompt, 3, greedy, None)
    assert proposal.sync_seconds > 0  # the prompt read as a catch-up, timed apart
    assert proposer.cached[:len(prompt)] == prompt and proposer.runner.length == len(proposer.cached)
    eager = DraftModelProposer(NativeRunner(model))
    eager.runner.extend(prompt[:-1], want_logits=False)  # the prompt prefilled beforehand
    eager.cached, eager.verified = prompt[:-1], len(prompt) - 1
    assert proposal.tokens == eager.propose(prompt, 3, greedy, None).tokens
    follow_up = prompt[:5] + [2, 8, 8]
    proposer.reset(follow_up)
    assert proposer.runner.length == 5 and proposer.cached == prompt[:5]  # kept, not recomputed
    fresh = DraftModelProposer(NativeRunner(model))
    fresh.reset(follow_up)
    assert proposer.propose(follow_up, 3, greedy, None).tokens == fresh.propose(follow_up, 3, greedy, None).tokens


def test_eagle_reads_the_prompt_features_at_its_first_draft(tmp_path):
    """Prompt features handed over are kept, not fed, until the head first drafts (so a request
    whose controller keeps to plain steps never pays for them); a later head of another sequence
    fed the same features drafts the same tree."""
    from specdec.spec.proposers.eagle import EagleProposer, TreeShape
    from specdec.spec.proposers.eagle_head import load_eagle

    from helpers import make_eagle_dir

    target_dir = make_model_dir(tmp_path / "t", tokenizer="char", vocab_size=24)
    target = load_native(target_dir, "float64")
    head = load_eagle(make_eagle_dir(tmp_path / "e", target_dir), torch.float64)[0]
    runner = NativeRunner(target)
    prompt = [3, 7, 1, 9, 4, 4, 12]
    runner.extend(prompt[:-1], want_hidden=True)
    greedy = SamplingParams(temperature=0.0)
    trees = []
    for _ in range(2):
        proposer = EagleProposer(head, target.model.embed_tokens, target.lm_head, runner.max_len, TreeShape())
        proposer.reset(prompt)
        proposer.observe_target(runner.last_hidden)
        assert proposer.committed == 0
        proposal = proposer.propose(prompt, 8, greedy, None)
        assert proposer.committed == len(prompt) - 1
        trees.append((proposal.tokens, proposal.parents))
    assert trees[0] == trees[1] and len(trees[0][0]) == 8


def test_graft_chain_follows_the_tree_and_appends_the_rest():
    from specdec.spec.proposers.trees import graft_chain

    tokens, parents = [5, 6, 7, 8], [-1, -1, 0, 2]  # 5 -> 7 -> 8 and 6 from the root
    got = graft_chain(tokens, parents, [5, 7, 9, 4])
    assert got == ([5, 6, 7, 8, 9, 4], [-1, -1, 0, 2, 2, 4], [0, 2, 4, 5])
    assert graft_chain(tokens, parents, [6]) == (tokens, parents, [1])
    assert graft_chain([], [], [3, 3]) == ([3, 3], [-1, 0], [0, 1])


def test_chain_with_lookup_keeps_the_lookup_path_first_then_the_drafted_prefix():
    from specdec.spec.proposers.trees import chain_with_lookup

    assert chain_with_lookup([1, 2, 3], [], 3) == ([1, 2, 3], None)  # no match: the draft's chain
    assert chain_with_lookup([1, 2, 3], [1, 2, 3, 4], 3) == ([1, 2, 3, 4], None)  # agreeing: one chain
    # they part after 1: the lookup's 4 nodes and the draft's next token, max(k, 4 + 1) nodes
    assert chain_with_lookup([1, 2, 3], [1, 9, 8, 7], 3) == ([1, 2, 9, 8, 7], [-1, 0, 0, 2, 3])
    assert chain_with_lookup([1, 2, 3, 4, 5, 6], [5, 6], 6) == ([1, 2, 3, 4, 5, 6], [-1, 0, 1, 2, -1, 4])


def test_draft_model_greedy_drafts_hold_the_prompt_lookup_chain(tmp_path):
    """With lookup on, a greedy draft also holds what followed the context's last n-gram
    earlier, from the root (a tree where the draft model disagrees), at most max(k, 5) nodes;
    sampled drafts (verified against their distribution) and lookup off stay the model's chain."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24), "float64")
    prompt = [3, 7, 1, 9, 4, 12, 5, 3, 7]  # (3, 7) was followed by 1, 9, 4, 12

    def propose(lookup: bool, params: SamplingParams, k: int):
        proposer = DraftModelProposer(NativeRunner(model), lookup=lookup)
        proposer.reset(prompt)
        return proposer.propose(prompt, k, params, torch.Generator().manual_seed(0))

    greedy = SamplingParams(temperature=0.0)
    for k in (2, 3, 6):
        own, both = propose(False, greedy, k), propose(True, greedy, k)
        assert own.parents is None and len(own.tokens) == k
        chain = [1, 9, 4, 12][:max(k - 1, 4)]
        node, path = -1, []
        for token in chain:  # the lookup chain is a path from the root
            parents = both.parents or list(range(-1, len(both.tokens) - 1))
            node = next(i for i, (t, p) in enumerate(zip(both.tokens, parents)) if t == token and p == node)
            path.append(node)
        assert len(both.tokens) <= max(k, 5) and both.tokens[0] in (own.tokens[0], chain[0])
    sampled = propose(True, SamplingParams(temperature=1.0), 4)
    assert sampled.parents is None and sampled.draft_probs is not None


def test_eagle_greedy_trees_hold_the_prompt_lookup_chain(tmp_path):
    """A greedy tree keeps the chain prompt lookup proposes (what followed the context's last
    n-gram earlier) as a path from the root, within the node budget; sampled trees, whose
    verification needs the draft distribution, do not."""
    from specdec.spec.proposers.eagle import EagleProposer, TreeShape
    from specdec.spec.proposers.eagle_head import load_eagle

    from helpers import make_eagle_dir

    target_dir = make_model_dir(tmp_path / "t", tokenizer="char", vocab_size=24)
    target = load_native(target_dir, "float64")
    head = load_eagle(make_eagle_dir(tmp_path / "e", target_dir), torch.float64)[0]
    runner = NativeRunner(target)
    prompt = [3, 7, 1, 9, 4, 12, 5, 3, 7]  # (3, 7) was followed by 1, 9, 4, 12
    runner.extend(prompt[:-1], want_hidden=True)

    def propose(lookup: bool, params: SamplingParams, k: int):
        proposer = EagleProposer(head, target.model.embed_tokens, target.lm_head, runner.max_len, TreeShape(),
                                 lookup=lookup)
        proposer.reset(prompt)
        proposer.observe_target(runner.last_hidden)
        return proposer.propose(prompt, k, params, torch.Generator().manual_seed(0))

    def path_from_root(proposal, chain):
        node, found = -1, 0
        for token in chain:
            node = next((i for i, (t, p) in enumerate(zip(proposal.tokens, proposal.parents))
                         if t == token and p == node), None)
            if node is None:
                break
            found += 1
        return found

    greedy = SamplingParams(temperature=0.0)
    for k in (2, 4, 8):
        with_chain = propose(True, greedy, k)
        chain = prompt[2:][:max(k - 1, 4)]  # k - 1 tokens, at least 4 (LOOKUP_TOKENS) beside k - 1 grown nodes
        assert path_from_root(with_chain, chain) == len(chain)
        assert len(with_chain.tokens) == k + max(0, len(chain) - (k - 1)) <= max(k, 5)  # tree_floor
        assert all(p < i for i, p in enumerate(with_chain.parents))  # parents before children
    assert path_from_root(propose(False, greedy, 8), [1, 9, 4, 12]) < 4  # a random head's own tree
    sampled = propose(True, SamplingParams(temperature=1.0), 8)
    assert sampled.draft_probs is not None and len(sampled.tokens) <= 8


def test_a_draft_far_behind_reads_the_contexts_last_window_only(tmp_path):
    """A prompt longer than the draft's window (or a long run of plain steps) is not read whole:
    the draft restarts from the context's last `window` tokens and drafts what a draft handed that
    tail alone drafts, then follows the context from there."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, max_pos=64), "float32")
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(1)
    proposer = DraftModelProposer(NativeRunner(model))
    assert proposer.window == 32  # half the draft's 64 positions
    context = [rng.randrange(1, 24) for _ in range(100)]
    proposer.reset(context)
    tokens = proposer.propose(context, 3, greedy, None).tokens
    assert proposer.offset == 100 - 32 and proposer.runner.length <= 32 + 3
    tail = DraftModelProposer(NativeRunner(model))
    assert tokens == tail.propose(context[-32:], 3, greedy, None).tokens
    context += tokens[:1] + [5]  # a partly kept draft: the draft follows from its offset
    tail_context = context[68:]
    tail.reset(tail_context)
    assert proposer.propose(context, 3, greedy, None).tokens == tail.propose(tail_context, 3, greedy, None).tokens
    assert proposer.offset == 68


def test_a_restarted_draft_keeps_its_window_for_a_prompt_that_goes_on_from_it(tmp_path):
    """An editor's next request (the file to a cursor a little further on) holds the tokens the
    draft restarted from: the draft keeps those cache rows (offset and all) and reads only what is
    new, drafting what a draft restarted there afresh drafts; a prompt that differs after the
    offset (or ends before it) starts over from position 0."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, max_pos=64), "float32")
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(2)
    proposer = DraftModelProposer(NativeRunner(model))
    context = [rng.randrange(1, 24) for _ in range(100)]
    proposer.reset(context)
    proposer.propose(context, 3, greedy, None)
    assert proposer.offset == 68
    follow_up = context + [rng.randrange(1, 24) for _ in range(5)]  # the cursor 5 tokens on
    proposer.reset(follow_up)
    assert proposer.offset == 68 and proposer.cached == context[68:] and proposer.runner.length == 32
    fresh = DraftModelProposer(NativeRunner(model))  # the window's tokens read afresh at positions 0, 1, ...
    fresh.runner.extend(follow_up[68:-1], want_logits=False)
    fresh.cached, fresh.verified = follow_up[68:-1], len(follow_up) - 69
    assert proposer.propose(follow_up, 3, greedy, None).tokens == fresh.propose(follow_up[68:], 3, greedy, None).tokens
    assert proposer.offset == 68 and proposer.cached[:37] == follow_up[68:]
    edited = follow_up[:80] + [(t % 23) + 1 for t in follow_up[80:]]  # changed after the offset
    proposer.reset(edited)
    assert proposer.offset == 68 and proposer.cached == edited[68:80] and proposer.runner.length == 12
    proposer.reset(context[:50])  # ends before the offset: nothing of the window applies
    assert proposer.offset == 0 and proposer.cached == [] and proposer.runner.length == 0
    proposer.reset(context)
    assert proposer.offset == 0 and proposer.cached == [] and proposer.runner.length == 0


def test_past_its_window_a_same_vocabulary_draft_keeps_drafting_losslessly(tmp_path):
    import specdec
    target = make_model_dir(tmp_path / "t", tokenizer="char", vocab_size=24, max_pos=512)
    draft = make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, max_pos=48, layers=1, seed=3)
    spec = specdec.load(target=target, draft=draft, method="draft", dtype="float64", draft_tokens=3, calibrate=False,
                        tree_lookup=False)
    plain = specdec.load(target=target, dtype="float64", calibrate=False)
    prompt = "abcdefgabcdefg" * 12  # 168 tokens: past the draft's 48 positions
    for params in (dict(temperature=0), dict(temperature=0.9, seed=4)):
        got = spec.generate(prompt, max_new_tokens=40, ignore_eos=True, **params)
        assert got.token_ids == plain.generate(prompt, max_new_tokens=40, ignore_eos=True, **params).token_ids
        assert got.stats.drafted_tokens > 0


def test_a_draft_checks_prompt_lookup_guesses_in_its_passes_drafting_the_same(tmp_path):
    """The draft's guesses (what followed the context's last n-gram earlier) fed beside its next
    token: the drafts are the ones it drafts a token a pass, in fewer passes where the text
    repeats (a tiny model's own greedy text soon cycles), and its cache follows as before (a
    fresh draft proposes the same afterwards)."""
    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, scale=3.0), "float64")
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(1)
    start = [rng.randrange(1, 24) for _ in range(4)]
    own = DraftModelProposer(NativeRunner(model), ahead=False)
    own.reset(start)
    context = start + own.propose(start, 24, greedy, None).tokens  # the model's own text
    passes, proposers = {}, {}
    for ahead in (True, False):
        proposer = proposers[ahead] = DraftModelProposer(NativeRunner(model), ahead=ahead)
        proposer.reset(context)
        calls = passes.setdefault(ahead, [])
        extend = proposer.runner.extend

        def counted(ids, *args, extend=extend, calls=calls, **kwargs):
            calls.append(len(ids))
            return extend(ids, *args, **kwargs)

        proposer.runner.extend = counted
    for step in range(12):
        k = rng.randrange(1, 7)
        drafts = {ahead: p.propose(context, k, greedy, None) for ahead, p in proposers.items()}
        assert drafts[True].tokens == drafts[False].tokens
        kept = k if step % 3 else rng.randrange(0, k)  # mostly kept: the text stays the model's own
        context = context + drafts[True].tokens[:kept] + [rng.randrange(1, 24)]
    assert len(passes[True]) < len(passes[False])
    assert max(passes[True]) > 2  # guesses were fed beside the drafted token
    fresh = DraftModelProposer(NativeRunner(model), ahead=False)
    fresh.reset(context)
    assert proposers[True].propose(context, 5, greedy, None).tokens == fresh.propose(context, 5, greedy, None).tokens
    sampled = SamplingParams(temperature=0.8)
    for seed in range(6):  # sampled drafts: the same draws row by row, the same drafts and distributions
        drafts = {ahead: p.propose(context, 6, sampled, torch.Generator().manual_seed(seed))
                  for ahead, p in proposers.items()}
        assert drafts[True].tokens == drafts[False].tokens
        # (this float64 eager model rounds a wider pass's rows in the last bits; verification reads the
        # distributions the draws came from, whatever they are)
        assert torch.allclose(drafts[True].draft_probs, drafts[False].draft_probs, rtol=1e-9, atol=1e-12)


def test_a_batched_draft_checks_guesses_per_sequence_drafting_the_same(tmp_path, monkeypatch):
    """BatchDraftModel feeds each sequence's guesses beside its next token (within GUESS_ROWS rows
    a pass): the drafts of a batch without guesses, in fewer batched passes."""
    from specdec.spec.proposers import batch_draft
    from specdec.spec.proposers.batch_draft import BatchDraftModel, DraftRequest

    model = load_native(make_model_dir(tmp_path / "d", tokenizer="char", vocab_size=24, scale=3.0), "float64")
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(2)
    contexts = []
    for _ in range(2):  # each the model's own text, which soon cycles
        start = [rng.randrange(1, 24) for _ in range(4)]
        own = DraftModelProposer(NativeRunner(model), ahead=False)
        own.reset(start)
        contexts.append(start + own.propose(start, 20, greedy, None).tokens)

    def run(rows: int, slots: int) -> tuple[list[list[int]], int]:
        monkeypatch.setattr(batch_draft, "GUESS_ROWS", rows)
        drafter = BatchDraftModel(model, 2, 96)
        passes = []
        forward = drafter.runner.forward
        drafter.runner.forward = lambda plan: passes.append(plan) or forward(plan)
        context, out = [list(c) for c in contexts], []
        for step in range(8):
            k = rng.randrange(1, 6)
            drafted = drafter.propose([DraftRequest(slot, context[slot], k, greedy, None) for slot in range(slots)])
            out += [drafted[slot].tokens for slot in range(slots)]
            for slot in range(slots):
                context[slot] += drafted[slot].tokens[:k if step % 3 else 0] + [rng.randrange(1, 24)]
        return out, len(passes)

    state = rng.getstate()
    for slots in (1, 2):  # a batched pass lasts as long as its slowest sequence needs: one alone
        rng.setstate(state)
        guessed, guessed_passes = run(batch_draft.GUESS_ROWS, slots)
        rng.setstate(state)
        plain, plain_passes = run(1, slots)  # no room for guesses
        assert guessed == plain
        assert guessed_passes < plain_passes or slots == 2
