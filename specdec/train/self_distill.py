"""Self-distilled training data for draft heads of a pretrained target (EAGLE-3 and Medusa-2
train on the target's own generations, not on human text): prompts made from the training
split of the stdlib (held-out files never appear), answered by the target itself with
batched decoding. Two kinds, matching the prompt suites the bench measures: chat
instructions about functions (explain / docstring / tests / rename, rendered with the
target's chat template) and code completion from a function's signature and context."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from specdec.data.prompts import chat_prompts, function_snippets
from specdec.errors import SpecdecError


def training_prompts(files: list[Path], count: int) -> tuple[list[list[dict]], list[str]]:
    """`count` chat conversations and `count` code-completion prompts, spread evenly over the
    functions of `files` (the training split)."""
    funcs = [(p.name, h, s) for p in files for h, s in function_snippets(p)]
    if not funcs:
        raise SpecdecError("no functions found in the training files to make prompts from")
    step = max(1, len(funcs) // (2 * count))
    made = chat_prompts(funcs[::step], count)
    renames = [p.messages for p in made if p.task == "rewrite"][:count // 4]  # answers that copy code
    chats = [p.messages for p in made if p.task == "chat"][:count - len(renames)] + renames
    codes = [header[-1200:] for _, header, _ in funcs[step // 2::step][:count]]
    return chats, codes


def generate_answers(decoder, files: list[Path], out: Path, count: int, max_tokens: int,
                     temperatures: tuple[float, ...] = (0.0, 0.7), max_batch: int = 16, log=print) -> Path:
    """Write OUT/generations.jsonl: one line per prompt with the prompt's and the answer's
    token ids (prompts alternate between `temperatures`, seeded). Returns the file."""
    from specdec.chat.template import ChatTemplate

    template = ChatTemplate.from_tokenizer_config(decoder.tokenizer.config)
    chats, codes = training_prompts(files, count)
    texts = [template.render(m) for m in chats] + codes
    kinds = ["chat"] * len(chats) + ["code"] * len(codes)
    samplings = [{"temperature": temperatures[i % len(temperatures)], "seed": i} for i in range(len(texts))]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "generations.jsonl"
    t0 = time.time()
    results = decoder.generate_batch(texts, samplings=samplings, max_batch=max_batch,
                                      max_new_tokens=max_tokens)
    with path.open("w") as f:
        for kind, text, params, res in zip(kinds, texts, samplings, results):
            f.write(json.dumps({"kind": kind, "temperature": params["temperature"],
                                "prompt_ids": decoder.engine.encode_prompt(text), "output_ids": res.token_ids}) + "\n")
    n = sum(len(r.token_ids) for r in results)
    log(f"{len(texts)} answers, {n} tokens in {time.time() - t0:.0f}s -> {path}")
    return path


def read_generations(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def generations_text(gens: list[dict], target_pieces: list[bytes | None]) -> list[str]:
    """Each conversation (prompt + answer) as the text the target's ids stand for, special
    tokens written out (`<|im_start|>`), as a cross-vocabulary draft reads its context."""
    return [b"".join(target_pieces[t] or b"" for t in g["prompt_ids"] + g["output_ids"]).decode(errors="ignore")
            for g in gens]


def generations_tokens(path: Path, target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer, eos: int,
                       heldout_every: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """The target's answers re-encoded with a draft's own tokenizer (a draft with another
    vocabulary learns the target's outputs from their text), each followed by EOS, as uint16
    train and held-out token arrays; every `heldout_every`-th conversation is held out."""
    from specdec.spec.proposers.vocab_map import token_bytes

    texts = generations_text(read_generations(path), token_bytes(target_tokenizer))
    if not texts:
        raise SpecdecError(f"{path} holds no generations")
    parts: tuple[list[int], list[int]] = ([], [])
    for i, enc in enumerate(draft_tokenizer.encode_batch(texts, add_special_tokens=False)):
        part = parts[1] if heldout_every and i % heldout_every == heldout_every - 1 else parts[0]
        part.extend(enc.ids)
        part.append(eos)
    return np.asarray(parts[0], dtype=np.uint16), np.asarray(parts[1], dtype=np.uint16)
