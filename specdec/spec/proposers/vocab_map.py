"""Token bytes and the shared vocabulary of two tokenizers (cross-vocabulary drafting).

Tokens are compared by the bytes they stand for, not by their vocabulary strings: byte-level
BPE vocabularies spell bytes with printable stand-ins, SentencePiece ones spell spaces as
U+2581 and raw bytes as <0xNN>. Special tokens have no bytes of their own and match by
their text (<|endoftext|> in both vocabularies is the same token)."""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from specdec.errors import SpecdecError

# A draft can only propose shared tokens: below this many it is refused (or below a quarter
# of its own vocabulary, for tiny test vocabularies); below half of its vocabulary, a warning.
MIN_SHARED_TOKENS = 256
WARN_SHARED_FRACTION = 0.5
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table): printable Latin-1
    bytes stand for themselves, the others take the code points from 256 upwards in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_types(tok: Tokenizer) -> set[str]:
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    found = {decoder.get("type")}
    for inner in decoder.get("decoders", []) or []:
        found.add(inner.get("type"))
    return found


def special_ids(tok: Tokenizer) -> set[int]:
    return {i for i, added in tok.get_added_tokens_decoder().items() if added.special}


def token_bytes(tok: Tokenizer) -> list[bytes | None]:
    """The bytes each id stands for (a special token: its text; None: unknown). Byte-level
    pieces that are not valid UTF-8 alone keep their raw bytes."""
    size = tok.get_vocab_size()
    kinds = _decoder_types(tok)
    alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
    specials = special_ids(tok)
    out: list[bytes | None] = []
    for i in range(size):
        piece = tok.id_to_token(i)
        if piece is None:
            out.append(None)
        elif i in specials:
            out.append(piece.encode())
        elif alphabet is not None:
            out.append(bytes(alphabet[c] for c in piece) if all(c in alphabet for c in piece) else None)
        elif "ByteFallback" in kinds and _BYTE_FALLBACK.fullmatch(piece):
            out.append(bytes([int(piece[3:5], 16)]))
        elif "Metaspace" in kinds or "Replace" in kinds:
            out.append(piece.replace("\u2581", " ").encode())
        else:
            text = tok.decode([i], skip_special_tokens=False)
            out.append(text.encode() if text and "\ufffd" not in text else None)
    return out


def check_round_trip(tok: Tokenizer, pieces: list[bytes | None], who: str) -> None:
    """Cross-vocabulary drafting re-encodes text: the tokenizer must give back the bytes of
    text made of its own tokens (no normalizer rewriting it, no added prefix space)."""
    model = json.loads(tok.to_str()).get("model") or {}
    skip = special_ids(tok) | {tok.token_to_id(model["unk_token"])} if model.get("unk_token") else special_ids(tok)
    texts = []
    for i, piece in enumerate(pieces[:400]):
        if i in skip:
            continue
        try:
            texts.append(piece.decode() if piece else "")
        except UnicodeDecodeError:
            continue
    probe = "".join(texts)
    ids = tok.encode(probe, add_special_tokens=False).ids
    if b"".join(pieces[i] or b"\0?" for i in ids) != probe.encode():
        raise SpecdecError(f"the {who}'s tokenizer does not map text back to the same bytes (it normalises "
                           "text or adds a prefix space): cross-vocabulary drafting re-encodes text, so it "
                           "needs a byte-exact tokenizer such as byte-level BPE")


@dataclass
class VocabMap:
    """Shared tokens: draft_ids[j] and target_ids[j] stand for the same bytes."""
    draft_ids: torch.Tensor  # [S] long
    target_ids: torch.Tensor  # [S] long
    target_index: torch.Tensor  # [target vocab] long: j with target_ids[j] == id, -1 if not shared
    draft_vocab_size: int
    target_vocab_size: int  # width of the target's distributions

    @property
    def size(self) -> int:
        return int(self.draft_ids.numel())


def build_vocab_map(draft_pieces: list[bytes | None], target_pieces: list[bytes | None],
                    draft_specials: set[int] = frozenset(), target_specials: set[int] = frozenset(),
                    target_vocab_size: int | None = None) -> VocabMap:
    """Pair every draft token with the target token of the same bytes (special tokens: same
    text). Duplicates keep the lowest id, so the map is one-to-one. target_vocab_size: the
    target model's logit width (padded embeddings make it larger than the tokenizer's)."""
    def key(i: int, piece: bytes, specials: set[int]) -> tuple:
        return ("special" if i in specials else "bytes", piece)

    width = target_vocab_size or len(target_pieces)
    by_key: dict[tuple, int] = {}
    for i, piece in enumerate(target_pieces[:width]):  # ids past the model's logits cannot be verified
        if piece:
            by_key.setdefault(key(i, piece, target_specials), i)
    pairs, used = [], set()
    for i, piece in enumerate(draft_pieces):
        t = by_key.get(key(i, piece, draft_specials)) if piece else None
        if t is not None and t not in used:
            used.add(t)
            pairs.append((i, t))
    target_index = torch.full((width,), -1, dtype=torch.long)
    for j, (_, t) in enumerate(pairs):
        target_index[t] = j
    return VocabMap(torch.tensor([d for d, _ in pairs], dtype=torch.long),
                    torch.tensor([t for _, t in pairs], dtype=torch.long),
                    target_index, len(draft_pieces), width)


def check_overlap(vmap: VocabMap) -> None:
    """Refuse a draft that shares too few tokens to propose anything useful; warn when much
    of its vocabulary is unusable (its mass there is dropped)."""
    need = min(MIN_SHARED_TOKENS, vmap.draft_vocab_size // 4)
    if vmap.size < max(need, 1):
        raise SpecdecError(f"the draft's vocabulary shares only {vmap.size} tokens with the target's "
                           f"(of {vmap.draft_vocab_size}); cross-vocabulary drafting needs at least {need}")
    if vmap.size < WARN_SHARED_FRACTION * vmap.draft_vocab_size:
        warnings.warn(f"the draft shares only {vmap.size} of its {vmap.draft_vocab_size} tokens with the "
                      "target's vocabulary: it can propose only those, expect few accepted drafts", stacklevel=3)


def same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    """Same tokens with the same ids: the draft's tokens are the target's."""
    return a.get_vocab_size() == b.get_vocab_size() and a.get_vocab(with_added_tokens=True) == b.get_vocab(
        with_added_tokens=True)


# Byte strings at UTF-8 character bounds (a token's bytes may end inside a character)

def incomplete_tail(data: bytes) -> int:
    """Length of a trailing UTF-8 character still missing bytes (a lead byte followed by
    fewer continuation bytes than it announces): bytes that a later token may complete."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead byte
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


def utf8_runs(data: bytes) -> list[tuple[bytes, bool]]:
    """data cut into runs of valid UTF-8 (True) and of bytes that are not (False)."""
    runs = []
    while data:
        try:
            data.decode()
            runs.append((data, True))
            break
        except UnicodeDecodeError as e:
            if e.start:
                runs.append((data[:e.start], True))
            runs.append((data[e.start:e.end], False))
            data = data[e.end:]
    return runs


def valid_prefix(data: bytes) -> str:
    """The text of data up to its first byte that is not valid UTF-8."""
    runs = utf8_runs(data)
    return runs[0][0].decode() if runs and runs[0][1] else ""
