"""Projection weights packed once for oneDNN's matmul (bfloat16 and float32).

On this CPU F.linear with a bfloat16 weight repacks the whole weight into oneDNN's blocked
layout on every call; for a decode pass that is most of the cost. Packing once at load time
(oneDNN's reorder op, which PyTorch's own inductor uses for frozen CPU linears;
kernels/torch_private.py) made SmolLM2's bf16 1-token pass 17.0 -> 14.0 ms here and its greedy decoding
50.0 -> 64.4 tokens/s (bench/results/README.md).

- bfloat16: the products are the same kernel's as F.linear's, and are checked at packing time
  to be equal bit for bit over the pass widths decoding uses: outputs do not change at all.
- float32: F.linear runs MKL's kernel, the packed weight oneDNN's, 1.7-2.7x faster here (the
  lm_head of SmolLM2: 7.0 -> 2.6 ms per 1-row pass). They agree to rounding (checked), not bit
  for bit; exact mode does not use them (its products run on kernels/rows.cpp, exact.py).

Where the op is missing or refuses the CPU (bf16 packing needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT),
or a check fails, weights are left unpacked and F.linear is used."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.kernels.torch_private import mkldnn_linear, mkldnn_linear_available, mkldnn_pack, tensor_version

CHECK_ROWS = (1, 2, 3, 5, 8, 16, 17, 33)
PACKED_DTYPES = (torch.bfloat16, torch.float32)
_verdicts: dict[tuple, bool] = {}  # (shape, dtype, bias, threads) -> packed products agree with F.linear's


def packing_available() -> bool:
    return mkldnn_linear_available()


class PackedWeight:
    """weight [N, K] (CPU) in oneDNN's layout; calling it computes F.linear(x, weight, bias).
    A weight changed in place since packing (training) is packed again."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self._pack()

    def _pack(self) -> None:
        self.version = tensor_version(self.weight)
        self.packed = mkldnn_pack(self.weight)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if tensor_version(self.weight) != self.version:
            self._pack()
        return mkldnn_linear(x, self.packed, bias)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()


@torch.inference_mode()
def _agrees_with_linear(packed: PackedWeight, bias: torch.Tensor | None) -> bool:
    """bfloat16: equal bit for bit; float32: equal to rounding (another kernel, see above)."""
    g = torch.Generator().manual_seed(0)
    weight = packed.weight
    for m in CHECK_ROWS:
        x = torch.randn(m, weight.shape[1], generator=g).to(weight.dtype)
        ours, reference = packed(x, bias), F.linear(x, weight, bias)
        if weight.dtype == torch.bfloat16 and not torch.equal(ours, reference):
            return False
        if not torch.allclose(ours, reference, rtol=1e-4, atol=1e-4 * float(reference.abs().max())):
            return False
    return True


def packed_bytes(module: torch.nn.Module) -> int:
    """Bytes of the packed copies held by a module's projections (models/llama.py's PackedLinear
    modules, and the fused projections' .packed, its FusedLinear)."""
    found = [getattr(m, "packed", None) for m in module.modules()]
    found += [getattr(getattr(m, name, None), "packed", None) for m in module.modules() for name in ("qkv", "gate_up")]
    return sum(p.nbytes for p in found if isinstance(p, PackedWeight))


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedWeight | None:
    """The packed weight, or None where packing does not apply (not bfloat16 or float32 on
    CPU, no oneDNN) or its products would not agree with F.linear's (checked once per shape)."""
    if weight.dtype not in PACKED_DTYPES or weight.device.type != "cpu" or not packing_available():
        return None
    key = (tuple(weight.shape), weight.dtype, bias is not None, torch.get_num_threads())
    if _verdicts.get(key) is False:
        return None
    try:
        packed = PackedWeight(weight)
        if key not in _verdicts:
            _verdicts[key] = _agrees_with_linear(packed, bias)
    except RuntimeError:  # oneDNN's bf16 packing needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
        _verdicts[key] = False
    return packed if _verdicts[key] else None
