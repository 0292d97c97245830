"""An editor's completion session, per method: the file from a fixed line to a cursor that moves
down a function's body a few lines a request (what an editor sends as the user types on), each
request answered with prefix reuse on (as `specdec serve` keeps it: the last request's cache). The
first request of a session reads the whole ~10,000-character prompt; the later ones only what is
new, so their time is decoding (and any drafter's reads). Methods take turns request by request;
each request's greedy tokens are compared with the first method's (list `none` first: lossless).

    python scripts/editor_session.py qwen-coder none,ngram,draft,draft+lookup [new_tokens] [requests] [sessions]
"""
import statistics
import sys
import time

import torch

from specdec.data.corpus import split_files, stdlib_root
from specdec.data.prompts import long_functions
from specdec.engine.decoder import load
from specdec.kernels import build
from specdec.models.bundled import default_head

LINES_A_REQUEST = 3
PROMPT_CHARS = 10_000


def sessions(count: int) -> list[tuple[str, list[str], int, int]]:
    """(file name, lines, first line, body line) for functions with ~10,000 characters above them."""
    out = []
    for path in split_files(stdlib_root())[1]:
        lines, funcs = long_functions(path, 20)
        for node in funcs:
            body = node.body[0].lineno - 1
            if PROMPT_CHARS <= len("".join(lines[:body])):
                start, size = body, 0
                while start > 0 and size < PROMPT_CHARS:
                    start -= 1
                    size += len(lines[start])
                out.append((path.name, lines, start, body))
                break  # one function a file: sessions over different files
    return out[:count]


def main() -> None:
    target, methods = sys.argv[1], sys.argv[2].split(",")
    new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    requests = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    count = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    torch.set_num_threads(2)
    decoders = {}
    for m in methods:
        base, _, extra = m.partition("+")  # NAME+lookup: greedy drafts hold the prompt-lookup chain
        # memory=False: a run must not start from what earlier runs taught the controllers
        decoders[m] = load(target=target, method=base, dtype="bfloat16", memory=False,
                           draft=default_head(target, base) if base in ("draft", "eagle", "medusa") else None,
                           tree_lookup=True if extra == "lookup" else None)
    for decoder in decoders.values():
        decoder.generate("def f(x):\n    return", temperature=0.0, max_new_tokens=8, ignore_eos=True)
    later = {m: [] for m in methods}  # (wall, decode seconds, tokens) of each session's later requests
    first = {m: [] for m in methods}
    same = {m: 0 for m in methods}  # requests whose greedy tokens equal the first method's
    for name, lines, start, body in sessions(count):
        outputs: dict[int, list[int]] = {}
        for r in range(requests):
            prompt = "".join(lines[start:body + LINES_A_REQUEST * r])
            for m, decoder in decoders.items():
                t0 = time.perf_counter()
                result = decoder.generate(prompt, temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
                wall, s = time.perf_counter() - t0, result.stats
                outputs.setdefault(r, result.token_ids)  # the first method's (none, listed first: plain's)
                same[m] += result.token_ids == outputs[r]
                (later if r else first)[m].append((wall, s.wall_seconds - s.prefill_seconds, s.new_tokens))
                print(f"{name} request {r} {m:6s} {wall:6.2f} s (prefill {s.prefill_seconds:5.2f} s, "
                      f"{s.cached_prompt_tokens} prompt tokens reused; {s.target_forwards} passes, "
                      f"drafting {s.draft_seconds:.2f} s)", flush=True)
    plain = sum(w for w, _, _ in later["none"]) if "none" in later else None
    print(f"\n{target}, {count} sessions x {requests} requests of {new_tokens} tokens, greedy; {build.cpu_model()}, "
          f"{torch.get_num_threads()} threads")
    for m in methods:
        wall = sum(w for w, _, _ in later[m])
        tokens = sum(n for _, _, n in later[m])
        decode = sum(d for _, d, _ in later[m])
        ratio = f"{plain / wall:.2f}x" if plain else "-"
        print(f"{m:6s} later requests: {wall:6.2f} s in all, {statistics.mean(w for w, _, _ in later[m]):.3f} s a "
              f"request, decoding {tokens / decode:5.1f} tok/s, {ratio} plain's time | first requests "
              f"{sum(w for w, _, _ in first[m]):.2f} s | tokens identical to {methods[0]}'s: "
              f"{same[m]}/{len(later[m]) + len(first[m])}")


if __name__ == "__main__":
    main()
