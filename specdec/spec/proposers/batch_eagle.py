"""A batch's EAGLE heads read together: the forks of a decoder's EagleProposer (one a sequence,
engine/batch_drafting.py) keep their head caches in the slots of one BatchKVCache, so the
features each has not read yet go through the head in one pass for all of them, and their
one-node drafts (the root's best child) come out of one projection.

Why: a fork drafts alone, one head pass and one projection of one row each, ~0.3-0.6 ms a
sequence on SmolLM2 (2 cores). At 16 sequences that is 5-10 ms a step, against a 32-row target
pass that costs ~1.2x a 16-row one on some CPUs (AMD Zen 5): one-node drafts could pay there,
but not drafted one sequence after another. A batch of 16 leaves a tree method one node a
sequence (engine/batch_drafting.py limits), so the one-node draft is the case that counts; bigger
trees still grow fork by fork. The drafts are what each fork's own propose(context, 1) gives
(the top child of the root; a proposal is lossless whatever it holds: verification decides)."""
from __future__ import annotations

import time

import torch

from specdec.models.cache import BatchKVCache
from specdec.models.linear import project
from specdec.sampling import SamplingParams
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.eagle import EagleProposer


class BatchEagleHeads:
    def __init__(self, proposer: EagleProposer, max_batch: int):
        head = proposer.head
        c, w = head.config, head.norm.weight
        self.proposer = proposer
        self.cache = BatchKVCache(1, c.num_key_value_heads, c.head_dim, proposer.cache_len, w.dtype, w.device,
                                  max_batch)
        self.slots = 0  # forks made so far, each on its own slot

    def fork(self) -> EagleProposer:
        """A new fork whose head cache is the next slot (a batch makes at most max_batch forks)."""
        if self.slots == self.cache.batch_size:
            raise RuntimeError("more EAGLE forks than the batch has slots")
        self.slots += 1
        return self.proposer.fork(self.cache.slot(self.slots - 1))

    @torch.inference_mode()
    def propose_one(self, forks: list[EagleProposer], contexts: list[list[int]], params: SamplingParams
                    ) -> tuple[list[Proposal], float]:
        """Greedy one-node drafts of forks (made by fork()) after their contexts: each fork's
        unread features through the head, all in one pass, then the root's top child. Returns
        the proposals (empty where a fork has nothing to read) and the seconds of the features
        that plain steps left (catch-up, not drafting), shared out by rows."""
        head = self.proposer.head
        feats, tokens, positions, base, write, ends, earlier_rows = [], [], [], [], [], [], 0
        reading = []
        stride = self.cache.keys[0].stride(0)
        for fork, context in zip(forks, contexts):
            taken = fork.take_pending()
            if taken is None:
                continue
            rows, earlier = taken
            m = rows.shape[0]
            next_tokens, rows_positions = fork.next_rows(m, context)
            feats.append(rows)
            tokens += next_tokens
            positions += rows_positions
            write += range(fork.committed, fork.committed + m)
            base += [fork.cache.b * stride] * m
            earlier_rows += earlier
            ends.append(len(write) - 1)
            reading.append(fork)
        if not reading:
            return [Proposal([]) for _ in forks], 0.0
        t0 = time.perf_counter()
        x = project(head.fc, torch.cat([torch.cat(feats), self.proposer.embed(torch.tensor(tokens))], dim=-1),
                    exact=False)
        out = head.stack(x, torch.tensor(positions), head.rope, self.cache.keys, self.cache.values, base, write,
                         [w + 1 for w in write])
        for fork, rows in zip(reading, feats):
            fork.committed += rows.shape[0]
            fork.cache.advance(rows.shape[0])
        roots = out[ends]
        for fork, root in zip(reading, roots):
            fork.root_feature = root
        drawn, _, _ = self.proposer.children(roots, 1, params, None)
        seconds = time.perf_counter() - t0
        # a chain of one: the node a 1-node tree holds, verified without a tree's key lists
        drafted = {id(fork): Proposal([row[0]]) for fork, row in zip(reading, drawn)}
        return [drafted.get(id(fork), Proposal([])) for fork in forks], seconds * earlier_rows / len(write)
