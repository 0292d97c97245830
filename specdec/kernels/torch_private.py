"""The one module that calls PyTorch's private APIs (names with a leading underscore), and why.

Each has no public equivalent in torch 2.5-2.13 that does the same work here; each caller has a
fallback on public APIs for when an entry is missing (a PyTorch that renamed it) or refuses the
CPU. Keeping them here makes a PyTorch upgrade a review of one file.

- oneDNN's packed linear (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`): the ops
  inductor itself uses for frozen CPU linears; packing a weight once instead of per call made
  SmolLM2's bf16 decoding 1.3x faster (models/packed.py). Fallback: F.linear.
- int8 / int4 weight-only matmuls (`torch._weight_int8pack_mm`, `torch._weight_int4pack_mm_for_cpu`,
  `torch._convert_weight_to_int4pack_for_cpu`): the CPU kernels gpt-fast and torchao use
  (models/quant.py). Fallback for int8 wide passes: F.linear on the dequantized weight.
- inductor's C++ code cache (`torch._inductor.codecache.CppPythonBindingsCodeCache`): compiles
  the bf16 row-attention kernel (models/row_attention.py) with torch's headers and the CPU's
  vector ISA, cached on disk. Fallback: PyTorch's attention in float32.
- inductor's config (`torch._inductor.config.patch`): freezing and the one-row GEMM template for
  `--compile` (models/compiled.py): freezing is read from the config when a graph compiles, not
  from `torch.compile(options=)`.
- `Tensor._version`: a packed copy must follow in-place changes to its weight (an optimizer step)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch


def mkldnn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def mkldnn_pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] in oneDNN's blocked layout, for mkldnn_linear."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


def mkldnn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def int8_weight_mm(rows: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch._weight_int8pack_mm(rows, qweight, scales)


def int4_pack(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] int32 values 0..15 in the int4 kernel's layout."""
    return torch._convert_weight_to_int4pack_for_cpu(q, 1)


def int4_weight_mm(rows: torch.Tensor, qweight: torch.Tensor, group_size: int,
                   scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch._weight_int4pack_mm_for_cpu(rows, qweight, group_size, scales_and_zeros)


def compile_cpp_binding(argtypes: Sequence[str], source: str) -> Callable:
    """A C++ function compiled (vector ISA on) and bound to Python by inductor's code cache."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return CppPythonBindingsCodeCache.load_pybinding(list(argtypes), source, needs_vec_isa=True)


def inductor_options(**options) -> AbstractContextManager:
    """inductor's config patched for the calls inside the `with`."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(**options)


def tensor_version(tensor: torch.Tensor) -> int:
    """A counter that in-place changes to the tensor increase."""
    return tensor._version
