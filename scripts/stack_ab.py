"""Two builds of the kernels' layer stack (rows.cpp stack_forward) over the same model in one
process: ms per pass of 1 / 4 / 8 tokens (or `widths`) after 200 cached (or `cached`: prefilled
once, each pass rolled back), the runner's LayerStack pointed at each library in turn pass by pass
(its output head stays on the running build), `rounds` pairs of passes a width: medians, and the
median of the new/old ratios of each pair, so that the VM's bandwidth swings fall on both alike.
First checks that both give the same bits: the logits of a 300-token prefill and of 1-, 4- and
8-token passes after it. Both libraries get the kernel variants this process chose. Build the
old one from a checkout (python -c "from specdec.kernels import build;
print(build._build(build._compiler()))").

    python scripts/stack_ab.py OLD.so smollm2 int8 [rounds] [cached] [widths]
    python scripts/stack_ab.py OLD.so qwen-coder gguf 25 200 1,2,3,4,8
    python scripts/stack_ab.py OLD.so qwen-coder-draft gguf4 30 200 1,2,3,4   # a draft rounded to 4 bits
"""
import statistics
import sys
import time

import torch

from specdec.engine.loading import load_runner
from specdec.kernels import build
from specdec.models.checkpoint import open_model


def logits(runner, widths: list[int]) -> list[torch.Tensor]:
    runner.reset()
    out = [runner.extend(list(range(100, 400)))]
    for width in widths:
        out.append(runner.extend(list(range(7, 7 + width))))
    return out


def main() -> None:
    old_path, target, variant = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 30  # pairs of passes a width
    cached = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    widths = [int(w) for w in sys.argv[6].split(",")] if len(sys.argv) > 6 else [1, 4, 8]
    torch.set_num_threads(2)
    new = build.load()
    old = build.load_beside(path=old_path)
    quantize = {"default": None, "gguf4": "gguf"}.get(variant, variant)
    runner = load_runner(open_model(target).path, "bfloat16", quantize=quantize, four_bit=variant == "gguf4")
    stack = runner.model.stack
    outputs = {}
    for name, lib in (("old", old), ("new", new)):
        stack.lib = lib
        outputs[name] = logits(runner, widths)
    same = all(torch.equal(a, b) for a, b in zip(outputs["old"], outputs["new"]))
    print(f"same bits (prefill of 300, passes of {', '.join(map(str, widths))}): {same}")
    # the cached tokens once (both builds write the same bits), then each pass rolled back
    runner.reset()
    runner.extend(list(range(100, 100 + cached)), exact=True)
    base = runner.length
    ms: dict[tuple, list[float]] = {}
    for width in widths:
        for _ in range(rounds):
            for name, lib in (("old", old), ("new", new)):
                stack.lib = lib
                runner.rollback(base)
                start = time.perf_counter()
                runner.extend(list(range(5, 5 + width)), exact=True)
                ms.setdefault((name, width), []).append((time.perf_counter() - start) * 1e3)
    for name in ("old", "new"):
        m = {w: statistics.median(ms[(name, w)]) for w in widths}
        print(f"{name}: " + " ".join(f"T{w} {m[w]:.2f}" for w in widths) + f" ms (x of T{widths[0]}: "
              + " ".join(f"{m[w] / m[widths[0]]:.2f}" for w in widths[1:]) + ")")
    ratios = {w: statistics.median(n / o for n, o in zip(ms[("new", w)], ms[("old", w)])) for w in widths}
    print("new/old, median of neighbouring passes: " + " ".join(f"T{w} {r:.3f}" for w, r in ratios.items()))

if __name__ == "__main__":
    main()
