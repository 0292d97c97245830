"""`--quantize int8` / `int4` on the grouped kernels: a model's float projections rounded once, at
load, into the layout GGUF blocks are unpacked to (models/grouped_weights.py Grouped), so that they
run on the one-call stack (models/stack.py) like a GGUF's own blocks.

Why: PyTorch's weight-only int8 / int4 CPU kernels (models/quant.py) were slower than the
bfloat16 stack on an AVX2 EPYC (SmolLM2, 1-token pass: int8 27.9 ms, int4 23.7 ms, bfloat16
11.8 ms), though they read half or a quarter of the bytes. The grouped kernels read each weight
byte once, with integer dot products, and every row is computed alike at any width (exact mode
costs nothing).

- int8: Q8_0's rounding: groups of 32 inputs, d = max|w| / 127, q = round(w / d) (halves away
  from zero) and d kept as float16, as llama.cpp's quantizer does, so the weights are the ones
  a Q8_0 GGUF of the same float weights holds.
- int4: groups of 32 with a scale and an offset (Q4_1's shape), in two levels where K is a
  multiple of 128 (grouped_weights.four_bit).
Activations are rounded to 8 bits by blocks of 32 inside the kernel (as llama.cpp's), so outputs
differ from the float model's by that rounding too; target and verifier share the one model,
so speculation stays exact with respect to it."""
from __future__ import annotations

import torch

from specdec.errors import SpecdecError
from specdec.kernels import build
from specdec.models.grouped import GroupedLinear, grouped_stack
from specdec.models.grouped_weights import Grouped, four_bit
from specdec.models.quant import fused_projections, replace_projections

GROUP = 32  # inputs per group: the kernels' group for 4-bit values and Q8_0's block


def q8_0(weight: torch.Tensor, rows_per_call: int = 4096) -> Grouped:
    """weight [N, K] (K a multiple of 32) rounded as Q8_0: int8 values, a float16-exact float32
    scale per group of 32."""
    N, K = weight.shape
    if K % GROUP:
        raise ValueError(f"Q8_0 groups of {GROUP} need K a multiple of {GROUP}")
    q = torch.empty(N, K, dtype=torch.int8)
    scale = torch.empty(N, K // GROUP, dtype=torch.float32)
    for start in range(0, N, rows_per_call):
        rows = slice(start, min(N, start + rows_per_call))
        w = weight[rows].to(torch.float32).reshape(-1, K // GROUP, GROUP)
        d = w.abs().amax(-1) / 127
        scaled = w * torch.where(d > 0, 1 / d, 0)[..., None]
        q[rows] = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8).reshape(-1, K)
        scale[rows] = d.to(torch.float16).to(torch.float32)
    return Grouped(q, scale, None, GROUP)


def grouped(weight: torch.Tensor, mode: str) -> Grouped:
    if mode == "int8":
        return q8_0(weight)
    return four_bit(lambda rows: weight[rows].to(torch.float32), *weight.shape)


def group_quantizable(model, mode: str, group_size: int) -> str | None:
    """Why the model's projections cannot go to the grouped kernels in this mode, or None."""
    if mode not in ("int8", "int4"):
        return f"mode {mode!r}"
    if mode == "int4" and group_size != GROUP:
        return f"int4 groups of {group_size} (the grouped kernels take {GROUP})"
    if model.dtype not in (torch.bfloat16, torch.float32) or model.device.type != "cpu":
        return f"a {model.dtype} model on {model.device.type}"
    if build.load() is None:
        return f"the kernels are unavailable ({build.unavailable()})"
    try:
        linears = fused_projections(model)
    except ValueError:
        return "projections that are not fused"
    if any(not isinstance(getattr(lin, "weight", None), torch.Tensor) for lin in linears):
        return "projections that are not float weights"
    if any(lin.weight.shape[1] % GROUP for lin in linears):
        return f"a projection whose inputs are not a multiple of {GROUP}"
    return None


def grouped_linear(linear, mode: str) -> GroupedLinear:
    """A float projection (nn.Linear, PackedLinear or a fused one) rounded to `mode` for the grouped kernels."""
    weight = linear.weight.detach()
    sizes = getattr(linear, "sizes", None)
    pieces = weight.split(sizes) if sizes else [weight]
    bias = None if linear.bias is None else linear.bias.detach()
    return GroupedLinear([grouped(w, mode) for w in pieces], bias, weight.dtype, split=bool(sizes))


def group_quantize_model(model, mode: str) -> None:
    """Replace a fused LlamaModel's projections (q/k/v, o, gate/up, down, lm_head) by
    GroupedLinear in `mode`, in place, and run its layers on the grouped stack. The float
    weights are dropped; the embedding stays in the model dtype (a lookup reads one row)."""
    replace_projections(model, lambda linear: grouped_linear(linear, mode))
    model.stack = grouped_stack(model)
    if model.stack is None:
        raise SpecdecError(f"the grouped kernels did not take this model's {mode} projections")
