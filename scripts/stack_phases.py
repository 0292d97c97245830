"""Where a pass's time goes: microseconds per pass in each step of the kernels' layer stack (rows.cpp
stack_forward: q/k/v, rope, attention, o, norm, gate/up, silu, down, the next norm), summed over
the layers, for passes of T new tokens after `cached` tokens, beside the whole pass (its output head
and Python included). The stack runs from a build with -DSPECDEC_PHASES (timers at each step's end;
a step's time includes its wait at the barrier after it), the head on the running build; both get
the kernel variants this process chose. Thread 0's times are shown (the team's steps end together).

    python scripts/stack_phases.py smollm2 default 1,8 200,2000 [passes]
    python scripts/stack_phases.py qwen-coder gguf 1,4 200
    python scripts/stack_phases.py qwen-coder-draft gguf4 1 200   # a draft's projections rounded to 4 bits
"""
import ctypes
import sys
import time

import torch

from specdec.engine.loading import load_runner
from specdec.kernels import build
from specdec.models.checkpoint import open_model

STEPS = ("qkv", "rope", "attend", "o", "norm", "gate_up", "silu", "down", "norm2", "norm0")
THREADS = 64  # rows.cpp PHASE_THREADS


def main() -> None:
    target, variant = sys.argv[1], sys.argv[2]
    widths = [int(w) for w in sys.argv[3].split(",")]
    cached = [int(c) for c in sys.argv[4].split(",")]
    passes = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    torch.set_num_threads(2)
    timed = build.load_beside(("SPECDEC_PHASES",))
    table = (ctypes.c_double * (THREADS * len(STEPS)))()
    quantize = {"default": None, "gguf4": "gguf"}.get(variant, variant)
    runner = load_runner(open_model(target).path, "bfloat16", quantize=quantize, four_bit=variant == "gguf4")
    runner.model.stack.lib = timed
    print(f"{target} {variant}, {build.cpu_model()}, {torch.get_num_threads()} threads, {build.kernels_in_use()}; "
          f"us per pass (thread 0), {passes} passes each")
    for n in cached:
        runner.reset()
        runner.extend(list(range(100, 100 + n)))
        base = runner.length
        for width in widths:
            for _ in range(5):  # warm-up
                runner.rollback(base)
                runner.extend(list(range(5, 5 + width)), exact=True)
            timed.phase_seconds_take(table)
            start = time.perf_counter()
            for _ in range(passes):
                runner.rollback(base)
                runner.extend(list(range(5, 5 + width)), exact=True)
            whole = (time.perf_counter() - start) / passes * 1e6
            timed.phase_seconds_take(table)
            steps = {name: table[i] / passes * 1e6 for i, name in enumerate(STEPS)}
            stack = sum(steps.values())
            cells = "  ".join(f"{name} {us:.0f}" for name, us in steps.items())
            print(f"T={width} after {n}: pass {whole:.0f} = stack {stack:.0f} ({cells}) + head and rest "
                  f"{whole - stack:.0f}; products {sum(steps[s] for s in ('qkv', 'o', 'gate_up', 'down')) / whole:.0%}"
                  f", attention {steps['attend'] / whole:.0%}", flush=True)


if __name__ == "__main__":
    main()
