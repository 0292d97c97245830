"""Two builds of the kernels' layer stack (rows.cpp stack_forward) over the same model in one
process: ms per pass of 1 / 4 / 8 tokens after 200 cached (or `cached`: prefilled once, each pass
rolled back), the runner's LayerStack pointed at each library in turn (its output head stays on
the running build), medians over rounds, so that the VM's bandwidth swings fall on both alike.
First checks that both give the same bits: the logits of a 300-token prefill and of 1-, 4- and
8-token passes after it. Both libraries get the kernel variants this process chose. Build the
old one from a checkout (python -c "from specdec.kernels import build;
print(build._build(build._compiler()))").

    python scripts/stack_ab.py OLD.so smollm2 int8 [rounds] [cached]
"""
import statistics
import sys
import time

import torch

from specdec.engine.loading import load_runner
from specdec.kernels import build
from specdec.models.checkpoint import open_model

WIDTHS = (1, 4, 8)


def logits(runner) -> list[torch.Tensor]:
    runner.reset()
    out = [runner.extend(list(range(100, 400)))]
    for width in WIDTHS:
        out.append(runner.extend(list(range(7, 7 + width))))
    return out


def main() -> None:
    old_path, target, variant = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    cached = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    torch.set_num_threads(2)
    new = build.load()
    old = build.load_beside(path=old_path)
    runner = load_runner(open_model(target).path, "bfloat16", quantize=None if variant == "default" else variant)
    stack = runner.model.stack
    outputs = {}
    for name, lib in (("old", old), ("new", new)):
        stack.lib = lib
        outputs[name] = logits(runner)
    same = all(torch.equal(a, b) for a, b in zip(outputs["old"], outputs["new"]))
    print(f"same bits (prefill of 300, passes of {', '.join(map(str, WIDTHS))}): {same}")
    # the cached tokens once (both builds write the same bits), then each pass rolled back
    runner.reset()
    runner.extend(list(range(100, 100 + cached)), exact=True)
    base = runner.length
    ms: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for name, lib in (("old", old), ("new", new)):
            stack.lib = lib
            for width in WIDTHS:
                times = []
                for _ in range(7):
                    runner.rollback(base)
                    start = time.perf_counter()
                    runner.extend(list(range(5, 5 + width)), exact=True)
                    times.append(time.perf_counter() - start)
                ms.setdefault((name, width), []).append(statistics.median(times) * 1e3)
    for name in ("old", "new"):
        m = {w: statistics.median(ms[(name, w)]) for w in WIDTHS}
        costs = " ".join(f"T{w} {m[w]:.2f}" for w in WIDTHS)
        print(f"{name}: {costs} (4: {m[4] / m[1]:.2f}x 8: {m[8] / m[1]:.2f}x)")


if __name__ == "__main__":
    main()
