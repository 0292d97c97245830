"""EAGLE-2 dynamic draft trees (Li et al. 2024) from the EAGLE head (spec/proposers/eagle_head.py).

The head drafts at the feature level and keeps its own KV cache over the sequence. Each step it
grows a tree: expand the top-k children of the most probable nodes for a few depths, score nodes
by the product of draft probabilities along their path, keep the best N."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from specdec.models.cache import KVCache, SlotCache
from specdec.models.linear import project
from specdec.models.packed import packed_bytes
from specdec.models.runner import tensor_bytes
from specdec.sampling import SamplingParams, draw_distinct, final_probs
from specdec.sampling.penalties import PenaltyRows, TokenHistory, adjust_logits, tree_paths
from specdec.sampling.seeded import PositionNoise
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.draft_vocab import expand_logits
from specdec.spec.proposers.eagle_head import EagleHead
from specdec.spec.proposers.prompt_lookup import LOOKUP_TOKENS, PromptLookupProposer
from specdec.spec.proposers.trees import graft_chain, node_budgets

# The most target features the head reads at once, and (twice it) holds: further behind (a long
# prompt's features at its first draft) or longer, it restarts from the last HEAD_WINDOW positions
# (their rows from 0, rope at their own positions). SmolLM2 under a ~2,500-token file: the head's read
# of the whole prompt and its attention over it cost more than trees saved (decoding 0.92x plain
# with drafting off, 0.85-0.97x at fixed tree sizes). Any drafts are exact.
HEAD_WINDOW = 512


@dataclass
class TreeShape:
    top_k: int = 5  # children expanded per node
    depth: int = 7  # levels grown
    expand: int = 5  # nodes expanded per level (the most probable ones)
    nodes: int = 32  # N kept for verification (the controller may pick a smaller tree)


class EagleProposer:
    name = "eagle"
    shape = "tree"
    needs_hidden = True

    def __init__(self, head: EagleHead, embed: nn.Embedding, lm_head: nn.Module, max_len: int,
                 tree: TreeShape | None = None, lookup: bool = True, cache: KVCache | SlotCache | None = None):
        self.head, self.embed, self.lm_head = head, embed, lm_head
        # greedy trees also hold what followed the context's last n-gram earlier (prompt lookup):
        # code copies its prompt, which a head trained on other text drafts poorly
        self.lookup = PromptLookupProposer() if lookup else None
        self.tree_floor = LOOKUP_TOKENS + 1 if lookup else 0  # k < 5: the chain beside k - 1 grown nodes
        self.vocab_size = embed.num_embeddings
        self.tree = tree or TreeShape()
        self.tree_sizes = node_budgets(self.tree.nodes)
        self.max_len = max_len
        # its own cache, or a slot of a batch's (batch_eagle.py: the batch's heads read together)
        self.cache = cache if cache is not None else head.new_cache(self.cache_len)
        self.features: list[torch.Tensor] = []
        self.offset = 0  # the context position of the head cache's row 0 (HEAD_WINDOW)
        self.reset([])

    @property
    def cache_len(self) -> int:
        """Rows a head cache holds: the context and a tree's grown levels."""
        return self.max_len + self.tree.depth * self.tree.expand + 8

    def fork(self, cache: SlotCache | None = None) -> EagleProposer:
        """A proposer for another sequence: the same head, its own cache (or the slot given) and features."""
        return EagleProposer(self.head, self.embed, self.lm_head, self.max_len, self.tree, self.lookup is not None,
                             cache)

    def memory_bytes(self) -> int:
        """The head and its own cache (embedding and lm_head are the target's own; a batch's
        slot cache is the batch's)."""
        own = [*self.cache.keys, *self.cache.values] if isinstance(self.cache, KVCache) else []
        return tensor_bytes([*self.head.parameters(), *self.head.buffers(), *own]) + packed_bytes(self.head)

    def reset(self, prompt_ids: list[int], kept_features: int = 0) -> None:
        """A new text whose first kept_features positions' target features are the last
        text's (the target kept that prefix of its cache: the same tokens, the same bits). The
        head's own cache keeps its rows of that prefix where each row has the bits a fresh read
        writes (EagleHead.row_invariant; row i also read token i + 1, so one row fewer); else
        the head reads the prefix again at its first draft. Drafts never depend on earlier texts."""
        kept = torch.cat(self.features)[:kept_features] if kept_features and self.features else None
        rows = (min(self.committed, kept_features - 1) if kept is not None and self.head.row_invariant
                and self.offset == 0 else 0)
        self.offset = 0
        self.cache.rollback(rows)
        self.committed = rows
        self.features = [] if kept is None else [kept]  # every position's feature so far, in order
        self.pending = [] if kept is None else [kept[rows:]]
        self.root_feature: torch.Tensor | None = None  # predicted feature of the pending token

    def features_kept(self) -> int:
        """Leading positions whose target features the last text left (reset may keep them)."""
        return sum(f.shape[0] for f in self.features)

    def observe_target(self, hidden: torch.Tensor) -> None:
        self.features.append(hidden)
        self.pending.append(hidden)  # read at the next draft (_catch_up), the prompt's too

    def take_pending(self) -> tuple[torch.Tensor, int] | None:
        """The target features the head has not read, in order, and how many of them plain steps
        left (all but the last step's); the head cache back at its committed rows (the last
        tree's forgotten), restarted where they are too many (HEAD_WINDOW). None: none pending."""
        self.cache.rollback(self.committed)
        if not self.pending:
            return None
        unseen = sum(p.shape[0] for p in self.pending)
        if unseen > HEAD_WINDOW or self.committed + unseen > 2 * HEAD_WINDOW:
            self._restart(unseen)
        earlier = sum(p.shape[0] for p in self.pending[:-1])  # one entry per target step
        feats = torch.cat(self.pending) if len(self.pending) > 1 else self.pending[0]
        self.pending = []
        return feats, earlier

    @torch.inference_mode()
    def _catch_up(self, context: list[int]) -> float:
        """Feed the head the target features not seen yet, each paired with the next token.
        Returns the time spent on features left by plain steps (all but the last step's)."""
        taken = self.take_pending()
        if taken is None:
            return 0.0
        feats, earlier = taken
        sync_seconds = 0.0
        if earlier:
            t0 = time.perf_counter()
            self._feed(feats[:earlier], context)
            sync_seconds = time.perf_counter() - t0
        self.root_feature = self._feed(feats[earlier:], context)[-1]
        return sync_seconds

    def _restart(self, unseen: int) -> None:
        """The head cache emptied and the last HEAD_WINDOW positions' features pending instead
        (the last step's still apart: its last row predicts the root)."""
        every = torch.cat(self.features)  # position p's feature at row p
        if every.shape[0] != self.offset + self.committed + unseen:
            return  # not one feature a position (never seen): read all as before rather than guess
        last = self.pending[-1][-HEAD_WINDOW:]
        self.offset = every.shape[0] - HEAD_WINDOW
        earlier = every[self.offset:every.shape[0] - last.shape[0]]
        self.pending = [earlier, last] if earlier.shape[0] else [last]
        self.cache.rollback(0)
        self.committed = 0

    def next_rows(self, m: int, context: list[int]) -> tuple[list[int], range]:
        """The tokens paired with the next m features the head reads (each position's next
        token) and those features' context positions."""
        start = self.offset + self.committed  # a context position (the cache's row `committed`)
        return context[start + 1:start + m + 1], range(start, start + m)

    def _feed(self, feats: torch.Tensor, context: list[int]) -> torch.Tensor:
        next_tokens, positions = self.next_rows(feats.shape[0], context)
        out = self.head(feats[None], self.embed(torch.tensor(next_tokens))[None], torch.tensor(positions), self.cache)
        self.committed += feats.shape[0]
        return out[0]

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None) -> Proposal:
        if k <= 0:
            return Proposal([])
        sync_seconds = self._catch_up(context)
        if self.root_feature is None:
            return Proposal([])
        chain = []
        if self.lookup is not None and params.greedy and k > 1:  # a point mass: greedy verification only
            chain = self.lookup.propose(context, max(k - 1, LOOKUP_TOKENS), params, None, history).tokens
        proposal = self._grow_tree(self.root_feature, len(context) - 1, k, params, generator, history, noise, chain)
        proposal.sync_seconds = sync_seconds
        return proposal

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Float logits over the target's vocabulary (-inf outside a reduced draft vocabulary)."""
        if self.head.lm_head is None:
            return project(self.lm_head, features, exact=False).float()
        return expand_logits(project(self.head.lm_head, features, exact=False).float(), self.head.d2t, self.vocab_size)

    def children(self, features: torch.Tensor, top_k: int, params: SamplingParams,
                  generator: torch.Generator | None, rows: PenaltyRows | None = None,
                  exponentials: torch.Tensor | None = None,
                  ) -> tuple[list[list[int]], list[list[float]], torch.Tensor | None]:
        """Per feature row: child tokens and their draft log-probabilities; greedy takes the
        top k, sampling draws k without replacement from the final distribution q (returned).
        rows: with penalties, each feature row's token counts (the tree path it follows).
        exponentials: seeded races' noise for the children's position (seeded.py)."""
        if rows is None and self.head.lm_head is not None:  # no penalties or grammar: target ids play no part
            compact = project(self.head.lm_head, features, exact=False).float()  # over the draft vocabulary
            d2t = self.head.d2t
            if params.greedy:  # the top k lie inside the draft vocabulary: rank its N logits
                top = torch.log_softmax(compact, -1).topk(top_k, dim=-1)
                return d2t[top.indices].tolist(), top.values.tolist(), None
            # sampling: every filter (top-k, top-p, min-p) acts alike on the N logits and on the
            # expanded row (-inf elsewhere), so q is drawn over N tokens and expanded after:
            # measured here at T=1, full-vocabulary sampling was half of a drafting step
            own = None if exponentials is None else exponentials[:, d2t]
            drawn, q_own = draw_distinct(final_probs(compact, params), top_k, generator, exponentials=own)
            return ([d2t[row].tolist() for row in drawn], [q_own[i, row].log().tolist() for i, row in enumerate(drawn)],
                    expand_logits(q_own, d2t, self.vocab_size, outside=0.0))
        logits = self.draft_logits(features)
        if params.greedy:
            if rows is not None:
                logits = adjust_logits(logits, params, rows)
            top = torch.log_softmax(logits, -1).topk(top_k, dim=-1)
            return top.indices.tolist(), top.values.tolist(), None
        drawn, q = draw_distinct(final_probs(logits, params, rows), top_k, generator, exponentials=exponentials)
        return drawn, [q[row, tokens].log().tolist() for row, tokens in enumerate(drawn)], q

    def _grow_tree(self, root_feature: torch.Tensor, base: int, k: int, params: SamplingParams,
                   generator: torch.Generator | None, history: TokenHistory | None = None,
                   noise: PositionNoise | None = None, chain: list[int] | None = None) -> Proposal:
        """EAGLE-2 expansion from the predicted feature of the pending token (position `base`);
        chain (greedy): tokens grafted from the root that are kept before any grown node.

        Scores only fall along a path, so a node scoring no better than the k-th best node so
        far can never bring a descendant into the kept set: such nodes are not expanded, and
        the growth stops early once no frontier node can (same result, fewer head passes).
        When sampling, every expanded node keeps its q and all its draws for the verifier."""
        top_k, expand, depth_limit = min(self.tree.top_k, k), min(self.tree.expand, k), min(self.tree.depth, k)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        node_q: dict[int, torch.Tensor] = {}  # expanded node (-1: root) -> its q (sampling)
        node_draws: dict[int, list[int]] = {}
        frontier = [-1]  # nodes whose children the rows of `features` predict (-1: the root)
        cache_rows: dict[int, list[int]] = {-1: []}  # expanded node -> head-cache rows of its path
        features = root_feature[None]
        for depth in range(depth_limit):
            rows = None
            if history is not None:  # penalised as the target will be: by each frontier node's path
                paths = tree_paths(tokens, parents)
                rows = history.rows([paths[node + 1] for node in frontier])
            # the frontier's children hold the token at position base + 1 + depth
            exponentials = None if noise is None else noise.exponentials(base + 1 + depth)[None].expand(
                len(frontier), -1)
            drawn, logps, q = self.children(features, top_k, params, generator, rows, exponentials)
            children: list[tuple[int, int]] = []  # (node, row of its parent's feature)
            for row, parent in enumerate(frontier):
                parent_score = scores[parent] if parent >= 0 else 0.0
                if q is not None:
                    node_q[parent], node_draws[parent] = q[row], drawn[row]
                for tok, lp in zip(drawn[row], logps[row]):
                    children.append((len(tokens), row))
                    tokens.append(tok), parents.append(parent), scores.append(parent_score + lp)
            if depth + 1 == depth_limit:
                break
            kth_best = sorted(scores, reverse=True)[k - 1] if len(scores) >= k else float("-inf")
            children = sorted(children, key=lambda c: -scores[c[0]])[:expand]
            children = [c for c in children if scores[c[0]] > kth_best]
            if not children:
                break
            length, n = self.cache.length, len(children)
            mask = torch.zeros(n, length + n, dtype=torch.bool)
            mask[:, :self.committed] = True
            mask_rows, mask_cols = [], []
            for row, (node, _) in enumerate(children):
                path = cache_rows[node] = cache_rows[parents[node]] + [length + row]
                mask_rows += [row] * len(path)
                mask_cols += path
            mask[mask_rows, mask_cols] = True
            x_feat = features[[row for _, row in children]][None]
            x_tok = self.embed(torch.tensor([tokens[node] for node, _ in children]))[None]
            features = self.head(x_feat, x_tok, torch.full((n,), base + depth), self.cache, mask)[0]
            frontier = [node for node, _ in children]
        if chain:
            tokens, parents, path = graft_chain(tokens, parents, chain)
            scores += [0.0] * (len(tokens) - len(scores))
            for node in path:  # kept first: above every grown node's log-probability
                scores[node] = float("inf")
        # keep the best k nodes (ancestor-closed: a child never outranks its parent)
        if chain:  # a chain longer than the budget allows keeps k - 1 grown nodes too (tree_floor)
            k += max(0, len(path) - (k - 1))
        keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:k]
        keep_set = set(keep)
        keep = [i for i in range(len(tokens)) if i in keep_set and (parents[i] < 0 or parents[i] in keep_set)]
        new_index = {old: new for new, old in enumerate(keep)}
        kept_parents = [new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
        if not node_q:
            return Proposal([tokens[i] for i in keep], None, kept_parents)
        rows = [-1] + keep  # the root, then the kept nodes
        draft_probs = torch.zeros(len(rows), node_q[-1].shape[-1])
        for row, node in enumerate(rows):
            if node in node_q:
                draft_probs[row] = node_q[node]
        return Proposal([tokens[i] for i in keep], draft_probs, kept_parents,
                        [node_draws.get(node, []) for node in rows])
