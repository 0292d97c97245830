"""A projection's product on whichever kernel is right for the pass (exact, invariant or
PyTorch's, packed or not), and the projection modules inference swaps in: FusedLinear (Q/K/V or
gate/up as one product) and PackedLinear (a weight packed once for oneDNN)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels.choose import prefers_invariant
from specdec.models.exact import exact_linear
from specdec.models.packed import PackedWeight, pack_weight


class FusedLinear:
    """Several projections of the same input as one matmul: at decode time a pass reads each
    weight once in one large kernel instead of several small ones. The original Linear
    modules keep their (checkpoint) names, their weights re-pointed at slices of the fused
    matrix, so state_dict(), saving and training see the same parameters and memory is not
    doubled. Not a module: the fused matrix must not appear in state_dict()."""

    def __init__(self, linears: list[nn.Linear]):
        self.sizes = [lin.out_features for lin in linears]
        self.weight = torch.cat([lin.weight.detach() for lin in linears])
        has_bias = [lin.bias is not None for lin in linears]
        self.bias = torch.cat([lin.bias.detach() for lin in linears]) if all(has_bias) else None
        if any(has_bias) and not all(has_bias):
            raise ValueError("fusing linears needs all or none of them to have a bias")
        start = 0
        for lin, size in zip(linears, self.sizes):
            lin.weight = nn.Parameter(self.weight[start:start + size], requires_grad=lin.weight.requires_grad)
            if self.bias is not None:
                lin.bias = nn.Parameter(self.bias[start:start + size], requires_grad=lin.bias.requires_grad)
            start += size

        self.packed: PackedWeight | None = None  # set by LlamaModel.pack_weights()

    def __call__(self, x: torch.Tensor, exact: bool = False) -> tuple[torch.Tensor, ...]:
        return self.product(x, exact).split(self.sizes, dim=-1)

    def product(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The outputs side by side, unsplit."""
        return linear_product(x, self.weight, self.bias, self.packed, exact)


def linear_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   packed: PackedWeight | None, exact: bool) -> torch.Tensor:
    """x @ weight.T + bias: row-invariant if exact (exact.exact_linear); else on whichever of the
    invariant kernel and PyTorch's (the packed weight if there is one) times faster here for this
    shape and width (kernels/choose.py). While training the weight or inside a compiled graph,
    F.linear (the other kernels have no backward; inductor packs its frozen copy itself)."""
    if exact:
        return exact_linear(x, weight, bias)
    if torch.is_grad_enabled() and weight.requires_grad or torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    if prefers_invariant(x, weight, bias, packed):
        return exact_linear(x, weight, bias)
    return packed(x, bias) if packed is not None else F.linear(x, weight, bias)


def project(linear: nn.Module, x: torch.Tensor, exact: bool) -> torch.Tensor:
    """A projection; exact: every row computed as a 1-row pass computes it (exact.py)."""
    if not isinstance(linear, nn.Linear):  # PackedLinear, QuantizedLinear, GroupedLinear: their own kernels
        return linear(x, exact)
    return linear_product(x, linear.weight, linear.bias, None, exact)


class PackedLinear(nn.Module):
    """An nn.Linear swapped for inference: the same weight and bias Parameters (so tied weights stay
    tied and state_dict keys stay the same) beside a copy packed for oneDNN (packed.py); None where
    packing does not apply, then it runs as the nn.Linear did."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed: PackedWeight | None = pack_weight(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        return linear_product(x, self.weight, self.bias, self.packed, exact)


def pack_linears(parent: nn.Module, *names: str) -> None:
    """Swap parent's nn.Linear children `names` for PackedLinears (other modules are left as they are)."""
    for name in names:
        linear = getattr(parent, name)
        if isinstance(linear, nn.Linear):
            setattr(parent, name, PackedLinear(linear))
