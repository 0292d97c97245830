"""bfloat16 projection weights packed once for oneDNN's matmul.

On this CPU F.linear with a bfloat16 weight repacks the whole weight into oneDNN's blocked
layout on every call; for a decode pass that is most of the cost. Packing once at load time
(torch.ops.mkldnn._reorder_linear_weight, the op PyTorch's own inductor uses for frozen CPU
linears) made SmolLM2's bf16 1-token pass 21.1 -> 13.3 ms here (bench/README.md). The products
are the same kernel's, so they are checked at packing time to equal F.linear's bit for bit
over the pass widths decoding uses: exact mode's row-invariant plans (exact.py), and every
test comparing with the unpacked model, hold unchanged. Where the op is missing, or the check
fails, weights are left unpacked and F.linear is used."""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHECK_ROWS = (1, 2, 3, 5, 8, 16, 17, 33)
_verdicts: dict[tuple, bool] = {}  # (shape, bias, threads) -> packed products equal F.linear's


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedWeight:
    """weight [N, K] (bfloat16, CPU) in oneDNN's layout; calling it is F.linear(x, weight, bias)
    with the same bits. A weight changed in place since packing (training) is packed again."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.version = weight._version
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)
        self._chunks: dict[int, list[PackedWeight] | None] = {}

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.weight._version != self.version:
            self.__init__(self.weight)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")

    def chunks(self, k_chunk: int) -> list[PackedWeight] | None:
        """The weight split along its inputs, each part packed (exact mode's chunked plans);
        None where a part cannot be."""
        if k_chunk not in self._chunks:
            parts = [pack_weight(part) for part in self.weight.split(k_chunk, 1)]
            self._chunks[k_chunk] = None if None in parts else parts
        return self._chunks[k_chunk]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()


@torch.inference_mode()
def _equals_linear(packed: PackedWeight, bias: torch.Tensor | None) -> bool:
    g = torch.Generator().manual_seed(0)
    weight = packed.weight
    for m in CHECK_ROWS:
        x = torch.randn(m, weight.shape[1], generator=g).to(weight.dtype)
        if not torch.equal(packed(x, bias), F.linear(x, weight, bias)):
            return False
    return True


def packed_bytes(module: torch.nn.Module) -> int:
    """Bytes of the packed copies held by a module's projections (nn.Linear.packed, and the
    fused projections' .packed, models/llama.py's FusedLinear)."""
    found = [getattr(m, "packed", None) for m in module.modules()]
    found += [getattr(getattr(m, name, None), "packed", None) for m in module.modules() for name in ("qkv", "gate_up")]
    return sum(p.nbytes for p in found if isinstance(p, PackedWeight))


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedWeight | None:
    """The packed weight, or None where packing does not apply (not bfloat16 on CPU, no
    oneDNN) or its products would differ from F.linear's here (checked once per shape)."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not packing_available():
        return None
    packed = PackedWeight(weight)
    key = (tuple(weight.shape), bias is not None, torch.get_num_threads())
    if key not in _verdicts:
        _verdicts[key] = _equals_linear(packed, bias)
    return packed if _verdicts[key] else None
