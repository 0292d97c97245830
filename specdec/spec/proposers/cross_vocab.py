"""A draft model with another tokenizer than the target's (Timor et al. 2025, arXiv 2502.05202).

Two ways to turn the draft's guesses into target tokens:
- token-level intersection (TLI, any temperature): the draft's final distribution is
  restricted to the tokens both vocabularies share (same bytes), renormalised there, and
  handed over in target ids. Standard rejection sampling is exact for any proposal
  distribution q that the drafts were really sampled from, so the output keeps exactly the
  target's distribution whatever the temperature and filters. Greedy: the argmax over the
  shared tokens.
- string-level (greedy only): the draft decodes greedily over its whole vocabulary, and its
  text is re-encoded with the target's tokenizer. Exact at T=0, where verification keeps the
  target's argmax whatever was proposed. Under sampling the probability of a target token is
  a sum over every draft tokenization of its text, which we do not compute, so it is not
  used there: sampled steps use TLI.

The engine's context is target ids. The draft keeps its own KV cache over its own
tokenization of the same text: each step decodes the new target ids to bytes, keeps the
drafted tokens the target accepted (they stand for the same bytes), re-encodes the rest
with the draft's tokenizer from one token back (so a word split at the boundary is tokenized
as the draft would), and holds back an incomplete UTF-8 tail (no drafts until it completes)."""
from __future__ import annotations

import time
from dataclasses import replace

import torch
from tokenizers import Tokenizer

from specdec.errors import SpecdecError
from specdec.models.runner import Runner
from specdec.sampling import SamplingParams, final_probs, greedy_token, sample
from specdec.sampling.penalties import TokenHistory
from specdec.sampling.seeded import PositionNoise, race
from specdec.spec.proposers.base import Proposal
from specdec.spec.proposers.draft_model import DRAFT_WINDOW
from specdec.spec.proposers.prompt_lookup import LOOKUP_TOKENS, PromptLookupProposer, with_lookup_chain
from specdec.spec.proposers.vocab_map import (
    VocabMap,
    build_vocab_map,
    check_overlap,
    check_round_trip,
    incomplete_tail,
    special_ids,
    token_bytes,
    utf8_runs,
    valid_prefix,
)

CROSS_VOCAB_MODES = ("auto", "tli", "string")


def shared_distribution(shared_logits: torch.Tensor, vmap: VocabMap,
                        params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """TLI's proposal: the draft's final distribution over the shared tokens only
    (temperature and filters applied there, so it sums to 1 on them), as q[j] for shared
    token j and as a row over the target's vocabulary for the verifier."""
    q = final_probs(shared_logits[None], params)[0]
    row = torch.zeros(vmap.target_vocab_size, dtype=q.dtype)
    row[vmap.target_ids] = q
    return q, row


class CrossVocabProposer:
    name = "draft"
    shape = "chain"
    needs_hidden = False
    tree_sizes: list[int] = []

    def __init__(self, runner: Runner, draft_tokenizer: Tokenizer, target_tokenizer: Tokenizer, vmap: VocabMap,
                 draft_pieces: list[bytes | None], target_pieces: list[bytes | None], mode: str = "auto",
                 lookup: bool = False):
        self.runner = runner
        self.window = min(DRAFT_WINDOW, runner.max_len // 2)  # the draft tokens kept as it slides (_slide)
        # greedy drafts also hold the prompt-lookup chain (a tree where they differ): the target
        # must verify trees; a proposal of budget k then holds up to max(k, tree_floor) nodes
        self.lookup = PromptLookupProposer() if lookup else None
        self.tree_floor = LOOKUP_TOKENS + 1 if lookup else 0
        self.draft_tok = draft_tokenizer
        self.target_tok = target_tokenizer
        self.vmap = vmap
        self.draft_pieces = draft_pieces
        self.target_pieces = target_pieces
        self.draft_specials = special_ids(draft_tokenizer)
        self.byte_tokens = {p[0]: i for i, p in enumerate(draft_pieces)
                            if p and len(p) == 1 and i not in self.draft_specials}
        self.mode = mode
        self.reset([])

    def memory_bytes(self) -> int:
        return self.runner.memory_bytes()

    def fork(self) -> CrossVocabProposer:
        """A proposer for another sequence: the same draft model and vocabulary map, its own
        cache and tokenization state (the runner must fork: the native runtime's does)."""
        return CrossVocabProposer(self.runner.fork(), self.draft_tok, self.target_tok, self.vmap, self.draft_pieces,
                                  self.target_pieces, self.mode, self.lookup is not None)

    def kind(self, params: SamplingParams) -> str:
        """String-level at T=0 (unless mode is 'tli'); TLI whenever sampling."""
        return "string" if params.greedy and self.mode != "tli" else "tli"

    # ---------------------------------------------------------------- the two tokenizations
    def reset(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        self.text = bytearray()  # the context's bytes (target ids decoded)
        self.seen = 0  # context tokens already in text
        self.cached: list[int] = []  # draft ids in the draft cache
        self.ends: list[int] = []  # ends[i]: byte offset in text where cached[i] ends
        self.verified = 0  # leading cached tokens known to stand for text's bytes
        if prompt_ids:
            self._read(prompt_ids)
            tokens, ends, _ = self._draft_context()
            if 1 < len(tokens) < self.runner.max_len:
                self.runner.extend(tokens[:-1], want_logits=False)
                self.cached, self.ends = tokens[:-1], ends[:-1]
                self.verified = len(self.cached)

    def _read(self, context: list[int]) -> None:
        for t in context[self.seen:]:
            self.text += self.target_pieces[t] or b""
        self.seen = len(context)

    def _encode(self, start: int) -> tuple[list[int], list[int], bool]:
        """Draft tokens for text[start:], their end offsets, and whether an incomplete
        character at the end is held back. Valid UTF-8 goes through the draft's tokenizer;
        stray bytes (a target may sample them) become the draft's one-byte tokens."""
        data = bytes(self.text[start:])
        tail = incomplete_tail(data)
        ids: list[int] = []
        ends: list[int] = []
        pos = start
        for run, valid in utf8_runs(data[:len(data) - tail]):
            if valid:
                run_ids, run_ends = self._encode_text(run, pos)
                ids += run_ids
                ends += run_ends
            else:
                for b in run:
                    if b in self.byte_tokens:
                        ids.append(self.byte_tokens[b])
                        ends.append(pos + 1)
                    pos += 1
                continue
            pos += len(run)
        return ids, ends, tail > 0

    def _encode_text(self, run: bytes, start: int) -> tuple[list[int], list[int]]:
        string = run.decode()
        enc = self.draft_tok.encode(string, add_special_tokens=False)
        ids, ends, pos = enc.ids, [], start
        if b"".join(self.draft_pieces[i] or b"\0?" for i in ids) == run:
            for i in ids:
                pos += len(self.draft_pieces[i])
                ends.append(pos)
        else:  # unknown characters (a tokenizer without byte fallback): the encoding's offsets
            ends = [start + len(string[:o[1]].encode()) for o in enc.offsets]
            if ends:
                ends[-1] = start + len(run)
        return ids, ends

    def _draft_context(self) -> tuple[list[int], list[int], bool]:
        """The draft tokenization of text: cached tokens that still stand for it (accepted
        drafts included), then the rest re-encoded from one token back."""
        n = self.verified
        pos = self.ends[n - 1] if n else 0
        while n < len(self.cached):
            piece = self.draft_pieces[self.cached[n]] or b""
            if not piece or self.text[pos:pos + len(piece)] != piece:
                break
            pos += len(piece)
            n += 1
        if pos < len(self.text) and n > 0:
            n -= 1  # re-encode the last kept token with the new text
        start = self.ends[n - 1] if n else 0
        self.verified = min(n, len(self.cached))
        ids, ends, pending = self._encode(start)
        return self.cached[:n] + ids, self.ends[:n] + ends, pending

    def _slide(self, tokens: list[int], ends: list[int]) -> tuple[list[int], list[int], bool]:
        """Past the draft's window: the text before the draft's last `window` tokens dropped
        (at a token's end), its cache emptied, and the rest tokenized again from the start; the
        next catch-up reads it from position 0. So the draft drafts from the recent text at any
        context length (a model trained on a short window drafts from its last ~half), instead of
        not at all while each step still re-encoded the whole text (SmolLM2's 1,024-token draft
        under a ~2,000-token prompt: 2.6 ms a step, decoding 0.65x plain). Any drafts are exact."""
        del self.text[:ends[len(tokens) - self.window - 1]]
        self.runner.reset()
        self.cached, self.ends, self.verified = [], [], 0
        return self._draft_context()

    def _sync(self, tokens: list[int], ends: list[int]) -> list[int]:
        """Roll the draft cache back to its common prefix with tokens; return what to feed."""
        n = self.verified
        limit = min(len(self.cached), len(tokens) - 1)  # always feed at least one token
        while n < limit and self.cached[n] == tokens[n]:
            n += 1
        n = min(n, limit)
        self.runner.rollback(n)
        del self.cached[n:]
        self.ends = ends[:n]
        self.verified = n
        return tokens[n:]

    def _feed(self, ids: list[int], ends: list[int]) -> torch.Tensor:
        logits = self.runner.extend(ids, last_logits=True)[-1]
        self.cached.extend(ids)
        self.ends.extend(ends)
        return logits

    # ---------------------------------------------------------------- drafting
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, history: TokenHistory | None = None,
                noise: PositionNoise | None = None) -> Proposal:
        self._read(context)
        tokens, ends, pending = self._draft_context()
        if len(tokens) + k + 1 > self.runner.max_len and len(tokens) > self.window + 1:
            tokens, ends, pending = self._slide(tokens, ends)
        k = min(k, self.runner.max_len - len(tokens) - 1)
        if pending or not tokens or k <= 0:  # pending: an incomplete character the draft cannot see yet
            return Proposal([])
        feed = self._sync(tokens, ends)
        feed_ends = ends[len(self.cached):]
        sync_seconds = 0.0
        if len(feed) > 2:  # catch up after plain steps, timed apart
            t0 = time.perf_counter()
            self.runner.extend(feed[:-1], want_logits=False)
            self.cached.extend(feed[:-1])
            self.ends.extend(feed_ends[:-1])
            feed, feed_ends = feed[-1:], feed_ends[-1:]
            sync_seconds = time.perf_counter() - t0
        self.verified = len(self.cached)
        if self.kind(params) == "string":
            proposal = self._propose_string(feed, feed_ends, k, sync_seconds)
        else:
            proposal = self._propose_tli(feed, feed_ends, k, len(context), params, generator, noise, sync_seconds)
        return proposal if self.lookup is None else with_lookup_chain(proposal, self.lookup, context, k, params,
                                                                        history)

    def _propose_tli(self, feed: list[int], feed_ends: list[int], k: int, position: int, params: SamplingParams,
                     generator: torch.Generator | None, noise: PositionNoise | None,
                     sync_seconds: float) -> Proposal:
        """k target tokens drawn from the draft's distribution on the shared tokens."""
        vmap, tokens, rows = self.vmap, [], []
        end = feed_ends[-1]
        if params.penalized:  # penalties and biases count target ids: the draft goes without (any q is exact)
            params = replace(params, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                             logit_bias=())
        for i in range(k):
            logits = self._feed(feed, feed_ends)
            shared = logits[vmap.draft_ids]  # the draft's logits of the shared tokens
            if params.greedy:
                j = greedy_token(shared)
            else:
                q, row = shared_distribution(shared, vmap, params)
                if noise is not None:  # the race the target's seeded choice at this position runs
                    j = int(vmap.target_index[int(race(row, noise.exponentials(position + i)))])
                else:
                    j = sample(q, generator)
                rows.append(row)
            draft_id = int(vmap.draft_ids[j])
            tokens.append(int(vmap.target_ids[j]))
            end += len(self.draft_pieces[draft_id])
            feed, feed_ends = [draft_id], [end]
        return Proposal(tokens, torch.stack(rows) if rows else None, sync_seconds=sync_seconds)

    def _propose_string(self, feed: list[int], feed_ends: list[int], k: int, sync_seconds: float) -> Proposal:
        """Greedy draft text re-encoded into target tokens: up to k of them, leaving out the
        last one, which more draft text could still extend (" ret" before "urn")."""
        text, end, ids = b"", feed_ends[-1], []
        for _ in range(2 * k + 2):
            draft_id = greedy_token(self._feed(feed, feed_ends))
            piece = self.draft_pieces[draft_id] if draft_id < len(self.draft_pieces) else None
            if not piece or draft_id in self.draft_specials:
                break
            text += piece
            end += len(piece)
            feed, feed_ends = [draft_id], [end]
            string = valid_prefix(text)
            ids = self.target_tok.encode(string, add_special_tokens=False).ids if string else []
            if len(ids) > k:
                break
        return Proposal(ids[:min(k, max(len(ids) - 1, 0))], None, sync_seconds=sync_seconds)

    def observe_target(self, hidden: torch.Tensor) -> None:
        pass


def cross_vocab_proposer(runner: Runner, draft_tokenizer: Tokenizer, target_tokenizer: Tokenizer,
                         target_vocab_size: int, mode: str = "auto", lookup: bool = False) -> CrossVocabProposer:
    """The drafter for a draft model whose tokenizer is not the target's; refuses a pair that
    cannot work (tokenizers that do not give back their text, too few shared tokens)."""
    if mode not in CROSS_VOCAB_MODES:
        raise SpecdecError(f"unknown cross-vocabulary mode {mode!r}; choose from {', '.join(CROSS_VOCAB_MODES)}")
    draft_pieces, target_pieces = token_bytes(draft_tokenizer), token_bytes(target_tokenizer)
    check_round_trip(draft_tokenizer, draft_pieces, "draft")
    check_round_trip(target_tokenizer, target_pieces, "target")
    # only ids inside both models' logits can be proposed and verified
    proposable = [p if i < runner.vocab_size else None for i, p in enumerate(draft_pieces)]
    vmap = build_vocab_map(proposable, target_pieces, special_ids(draft_tokenizer), special_ids(target_tokenizer),
                           target_vocab_size)
    check_overlap(vmap)
    return CrossVocabProposer(runner, draft_tokenizer, target_tokenizer, vmap, draft_pieces, target_pieces, mode,
                              lookup)
