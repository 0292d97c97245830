"""30 layers of SmolLM2's projection shapes (960x576 q/k/v, 576x576 o, 3072x576 gate/up,
576x1536 down; bf16, random weights, not in cache) as one compiled graph: eager oneDNN,
inductor's default lowering (oneDNN, packed) and inductor's C++ GEMM template ("cpp",
max-autotune over CPP,ATEN: compiled.ONE_ROW_GEMM), ms a pass for 1 to 32 rows. Why
models/compiled.py gives 1-token passes a graph of their own on the template.

    python scripts/gemm_template.py eager 1
    python scripts/gemm_template.py default 1,4,16,32
    python scripts/gemm_template.py cpp 1,4,16,32
    python scripts/gemm_template.py peak 2048   # this machine's bf16 GEMM throughput, square

"peak" is the arithmetic floor under a wide pass: a T-row pass over W weights needs 2*T*W
flops however its kernel streams them (stop 31: 375-403 GFLOP/s here, so SmolLM2's 16-row pass
needs >= 10.7 ms; the stack above ran 16 rows at 175-195 GFLOP/s on the template).
"""
import sys
import time

import torch
import torch._inductor.config as inductor_config

from specdec.models.compiled import ONE_ROW_GEMM

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _ in range(LAYERS) for n, k in SHAPES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(LAYERS):
            qkv, o, gate_up, down = self.linears[4 * i:4 * i + 4]
            h = o(qkv(x)[..., :576])
            g = gate_up(h)
            x = x + down(torch.nn.functional.silu(g[..., :1536]) * g[..., 1536:])
        return x


def median_ms(fn, x: torch.Tensor, repeats: int = 30) -> float:
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


@torch.no_grad()
def main() -> None:
    torch.set_num_threads(2)
    mode, rows = sys.argv[1], [int(r) for r in sys.argv[2].split(",")]
    if mode == "peak":
        a, b = (torch.randn(rows[0], rows[0]).bfloat16() for _ in range(2))
        ms = median_ms(lambda x: x @ b, a, repeats=10)
        print(f"bf16 {rows[0]}^3 matmul: {ms:.2f} ms, {2 * rows[0] ** 3 / ms / 1e6:.0f} GFLOP/s", flush=True)
        return
    model = Stack().bfloat16().eval()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    options = {"freezing": True}
    if mode == "cpp":
        options.update(ONE_ROW_GEMM)  # what models/compiled.py compiles 1-token passes with
    fn = model
    with inductor_config.patch(**options):
        if mode != "eager":
            fn = torch.compile(model, dynamic=len(rows) > 1)
            t0 = time.perf_counter()
            fn(torch.randn(rows[0], 576).bfloat16())
            print(f"{mode}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        for r in rows:
            ms = median_ms(fn, torch.randn(r, 576).bfloat16())
            print(f"{mode} rows={r}: {ms:.2f} ms a pass, {nbytes / ms / 1e6:.1f} GB/s of weights, "
                  f"{r * nbytes / ms / 1e6:.0f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
