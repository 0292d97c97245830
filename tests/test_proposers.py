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


def test_eagle_prefill_feeds_the_prompt_before_the_first_step(tmp_path):
    """Prompt features handed over at prefill go into the head's cache at once (so the first
    step's drafting time holds no prompt feeding), and the first tree is the one a late
    catch-up gives."""
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
    for prefill in (True, False):
        proposer = EagleProposer(head, target.model.embed_tokens, target.lm_head, runner.max_len, TreeShape())
        proposer.reset(prompt)
        proposer.observe_target(runner.last_hidden, prefill=prefill)
        assert proposer.committed == (len(prompt) - 1 if prefill else 0)
        proposal = proposer.propose(prompt, 8, greedy, None)
        trees.append((proposal.tokens, proposal.parents))
    assert trees[0] == trees[1] and len(trees[0][0]) == 8
