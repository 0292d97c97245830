"""Log-probabilities of emitted (and prompt) tokens, and how tokens are shown as text/bytes.

Which distribution: the target model's RAW next-token distribution, log_softmax of its
logits before penalties, logit bias, temperature and top-k/top-p/min-p. OpenAI's reference
does not say which one it returns; vLLM returns the raw one by default (logprobs_mode
"raw_logprobs", the processed one on request). Raw is the only choice that stays useful at
temperature 0, where the processed distribution is a one-hot (every alternative at -inf,
which JSON cannot even carry), and it is what evaluation harnesses that score text with
echo + logprobs expect: the model's probability of the text, whatever the sampling settings.

They cost no extra pass: the verification pass already holds the target's logits for every
kept row (accepted drafts and the bonus token), and the prompt's come from the prefill pass.
They are always the target's, never a drafter's."""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import lru_cache

import torch
from tokenizers import decoders

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float  # natural log, under the target's raw distribution at this position
    top: tuple[tuple[int, float], ...] = ()  # the N most likely (token, logprob), most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """Row j of logits [T, V] is the pass row that predicted tokens[j] (T >= len(tokens))."""
    if not tokens:
        return []
    if logits.shape[0] < len(tokens):
        raise SpecdecError(f"logprobs need {len(tokens)} rows of logits, the pass returned {logits.shape[0]}")
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = torch.log_softmax(logits[:len(tokens)].to(dtype), dim=-1)
    chosen = logp.gather(-1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0].tolist()
    if top_n:
        top = logp.topk(min(top_n, logp.shape[-1]), dim=-1)
        alternatives = [tuple(zip(ids, values)) for ids, values in zip(top.indices.tolist(), top.values.tolist())]
    else:
        alternatives = [()] * len(tokens)
    return [TokenLogprob(t, lp, alt) for t, lp, alt in zip(tokens, chosen, alternatives)]


def last_entries(entries: list | None, n: int) -> list | None:
    """The last n entries (those a stream chunk's tokens added), or None when none are kept."""
    return None if entries is None else entries[len(entries) - n:]


# ---------------------------------------------------------------- tokens as text

def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable characters stand for themselves, the other
    bytes for the characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, shift = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            out[chr(256 + shift)] = b
            shift += 1
    return out


BYTE_LEVEL = _byte_level_alphabet()


class TokenTexts:
    """A token's exact bytes and its text, for logprobs in API responses. A byte-level BPE
    token may hold part of a UTF-8 character: such a token is shown as "bytes:\\xe2\\x80"
    (OpenAI's convention), which keeps distinct tokens distinct in completions' top_logprobs
    dicts; chat's `bytes` field is exact either way."""

    def __init__(self, tokenizer):
        self.tok = tokenizer.tok  # the `tokenizers` Tokenizer of a TextTokenizer
        self.byte_level = isinstance(self.tok.decoder, decoders.ByteLevel)
        self.token_bytes = lru_cache(maxsize=65536)(self._token_bytes)

    def _token_bytes(self, token: int) -> bytes:
        piece = self.tok.id_to_token(token)
        if piece is None:
            return b""
        if self.byte_level and all(c in BYTE_LEVEL for c in piece):
            return bytes(BYTE_LEVEL[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # SentencePiece byte fallback
            return bytes([int(piece[3:5], 16)])
        text = self.tok.decode([token], skip_special_tokens=False)
        return (text or piece).encode("utf-8")

    def text(self, token: int) -> str:
        data = self.token_bytes(token)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


_texts: dict[int, TokenTexts] = {}


def token_texts(tokenizer) -> TokenTexts:
    """One TokenTexts per tokenizer object (its byte cache is worth keeping)."""
    key = id(tokenizer.tok)
    if key not in _texts or _texts[key].tok is not tokenizer.tok:
        _texts[key] = TokenTexts(tokenizer)
    return _texts[key]


class TextOffsets:
    """Character offsets of successive tokens in a text, from their bytes: a token that ends
    inside a character moves the offset once the character is complete."""

    def __init__(self, start: int = 0):
        self.position = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def next(self, data: bytes) -> int:
        at = self.position
        self.position += len(self._decoder.decode(data))
        return at
