"""Two builds of the kernels (kernels/rows.cpp) side by side in one process: ms of M rows through
~100 MB of Q8_0-layout weights (signed 8-bit, groups of 32, columns layout for AVX-512 VNNI) or
4-bit weights with offsets, alternating the two libraries call by call, so that the VM's swings in
memory bandwidth fall on both alike. Build the old one from a checkout (python -c "from
specdec.kernels import build; print(build._build(build._compiler()))").

    python scripts/grouped_ab.py OLD.so NEW.so [rounds]
"""
import ctypes
import statistics
import sys
import time

import torch

from specdec.kernels import build

N, K, G = 4096, 3072, 32
WEIGHTS = 8  # 8 x 4096 x 3072 bytes: ~100 MB, beyond the caches


def library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    build._declare(lib)
    lib.set_grouped_kernel(1)
    return lib


def seconds(lib: ctypes.CDLL, weights, scales, bits: int, signed: int, M: int) -> float:
    x, y = torch.full((M, K), 0.5, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    scale, offset = scales
    start = time.perf_counter()
    for w in weights:
        lib.linear_grouped(x.data_ptr(), 1, w.data_ptr(), 1, bits, signed, scale.data_ptr(),
                           offset.data_ptr() if offset is not None else None, None, None, G, None, y.data_ptr(), 1,
                           N, M, N, K)
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(2)
    libs = [library(p) for p in sys.argv[1:3]]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    g = torch.Generator().manual_seed(0)
    formats = {
        "q8_0": ([torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g) for _ in range(WEIGHTS)],
                 (torch.rand(N, K // G, generator=g) * 0.01, None), 8, 1),
        "4-bit": ([torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g) for _ in range(2 * WEIGHTS)],
                  (torch.rand(N, K // G, generator=g) * 0.01, torch.rand(N, K // G, generator=g) * -0.01), 4, 0),
    }
    for name, (weights, scales, bits, signed) in formats.items():
        for M in (1, 4, 8):
            ms = [[], []]
            for _ in range(rounds):
                for i, lib in enumerate(libs):
                    seconds(lib, weights, scales, bits, signed, M)
                    ms[i].append(seconds(lib, weights, scales, bits, signed, M) * 1e3)
            old, new = (statistics.median(m) for m in ms)
            print(f"{name:6s} M={M}: old {old:.2f} ms  new {new:.2f} ms  ({old / new:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
