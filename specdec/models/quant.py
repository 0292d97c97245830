"""Weight-only int8 / int4 quantization of a loaded model's projections, on PyTorch's own CPU
kernels (gpt-fast's approach): decoding reads every weight once per pass, so halving (int8)
or quartering (int4) the bytes read is what makes a memory-bound pass faster. `--quantize`
loads onto the grouped kernels instead where they apply (models/group_quant.py); this is the
path of `--compile` (inductor lowers these ops), of int4 groups other than 32, and of CPUs
without the kernels.

- int8: symmetric, one scale per output channel (kernels/torch_private.py).
- int4: asymmetric, one scale and zero per group of `group_size` inputs
  (kernels/torch_private.py, gpt-fast's layout: w = (q - 8) * scale + zero).

Exact mode computes int8 rows on the batch-invariant kernel (kernels/rows.cpp) and int4 rows
one kernel call per row (exact.py): PyTorch's kernels give no such promise.
Their cost grows ~1 ms per row past 4 rows (SmolLM2, bench/results/README.md), so for wide non-exact
passes (a prefill) int8 multiplies by the weight dequantized on the fly; int4 keeps its
kernel (its weights cannot be unpacked cheaply): a SmolLM2 prefill then costs 1.2 ms per
token against bf16's 0.65.

Speculation stays lossless with respect to the quantized target: target and verifier see the
same quantized model. Embeddings stay in the model dtype (a lookup reads one row)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import SpecdecError
from specdec.kernels import invariant
from specdec.kernels.torch_private import int4_pack, int4_weight_mm, int8_weight_mm
from specdec.models.exact import rows_alone

QUANT_MODES = ("int8", "int4")
LOAD_MODES = (*QUANT_MODES, "gguf")  # gguf: keep a GGUF file's own quantized blocks (models/grouped.py)
INT4_GROUP_SIZES = (32, 64, 128, 256)
# measured on SmolLM2 (scripts/quant_loss.py): groups of 32 lose 0.036 nats/token of held-out
# loss, groups of 64 lose 0.28 (its weights are Q4_1, groups of 32 already)
DEFAULT_GROUP_SIZE = 32
KERNEL_MAX_ROWS = 32  # int8: wider non-exact passes (prefill) multiply by the dequantized weight instead


class QuantizedLinear(nn.Module):
    """y = x @ W.T (+ bias) with W stored quantized. sizes: split the output as a fused
    projection does (FusedLinear); None returns one tensor, as nn.Linear."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                 sizes: list[int] | None = None):
        super().__init__()
        out_features, in_features = weight.shape
        self.mode, self.group_size, self.sizes = mode, group_size, sizes
        self.in_features, self.out_features = in_features, out_features
        self.dtype = weight.dtype
        w = weight.detach().float()
        if mode == "int8":
            scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
            self.register_buffer("qweight", (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8))
            self.register_buffer("scales", scale.to(weight.dtype))
        elif mode == "int4":
            padded = -out_features % 16  # the kernel packs 16 output rows together: pad with zero rows
            w = torch.cat([w, w.new_zeros(padded, in_features)]) if padded else w
            groups = w.reshape(w.shape[0], in_features // group_size, group_size)
            low, high = groups.amin(-1), groups.amax(-1)
            scale = ((high - low) / 15).clamp_min(1e-12)
            q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
            self.register_buffer("qweight", int4_pack(q.reshape(w.shape[0], in_features)))
            zero = low + 8 * scale  # (q - 8) * scale + zero = q * scale + low
            self.register_buffer("scales", torch.stack([scale.t(), zero.t()], -1).to(weight.dtype).contiguous())
        else:
            raise SpecdecError(f"unknown quantization {mode!r}; choose from {', '.join(QUANT_MODES)}")
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def dequantized(self) -> torch.Tensor:
        """The weight the kernels multiply by, [out, in] in the model dtype (int8 only)."""
        return self.qweight.to(self.dtype) * self.scales[:, None]

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        y = self.product(x, exact)
        return y if self.sizes is None else y.split(self.sizes, dim=-1)

    def product(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The output unsplit (a fused projection's parts side by side, as FusedLinear.product)."""
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        if exact:
            y = self._exact_product(rows)
        elif self.mode == "int4":
            y = self._int4_product(rows)
        elif rows.shape[0] <= KERNEL_MAX_ROWS:
            y = int8_weight_mm(rows, self.qweight, self.scales)
        else:
            y = F.linear(rows, self.dequantized())
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _int4_product(self, rows: torch.Tensor) -> torch.Tensor:
        y = int4_weight_mm(rows, self.qweight, self.group_size, self.scales)
        return y[:, :self.out_features] if y.shape[1] != self.out_features else y

    def _exact_product(self, rows: torch.Tensor) -> torch.Tensor:
        """Every row computed alike whatever the number of rows: int8 on the invariant kernel,
        otherwise one kernel call per row (exact.py)."""
        if self.mode == "int8":
            y = invariant.linear(rows, self.qweight, self.scales, out_dtype=self.dtype)
            if y is not None:
                return y
            return rows_alone(lambda row: int8_weight_mm(row, self.qweight, self.scales), rows)
        return rows_alone(self._int4_product, rows)


def group_for(in_features: int, group_size: int) -> int:
    """group_size, or the largest smaller supported size that divides in_features (e.g. a
    864-wide down projection gets groups of 32 when 64 was asked for)."""
    fits = [g for g in INT4_GROUP_SIZES if g <= group_size and in_features % g == 0]
    return max(fits) if fits else group_size


def check_quantizable(weight: torch.Tensor, mode: str, group_size: int) -> str | None:
    """Why this weight cannot be quantized with these kernels, or None."""
    if weight.device.type != "cpu":
        return "the quantized kernels used here are CPU kernels"
    if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"weights in {weight.dtype}"
    if mode == "int4":
        if weight.dtype != torch.bfloat16:
            return "int4 needs bfloat16 weights (--dtype bfloat16)"
        if group_size not in INT4_GROUP_SIZES:
            return f"group size {group_size} (choose from {', '.join(map(str, INT4_GROUP_SIZES))})"
        group_size = group_for(weight.shape[1], group_size)
        if weight.shape[1] % group_size:
            return (f"a weight with {weight.shape[1]} inputs (int4 needs a multiple of {min(INT4_GROUP_SIZES)}; "
                    "use int8)")
    return None


def fused_projections(model: nn.Module) -> list[nn.Module]:
    """A fused LlamaModel's projections: each layer's q/k/v, o, gate/up and down, then the LM head."""
    layers = model.model.layers
    if any(layer.self_attn.qkv is None or layer.mlp.gate_up is None for layer in layers):
        raise ValueError("quantizing needs a fused model (LlamaModel.fuse_projections)")
    return [lin for layer in layers for lin in (layer.self_attn.qkv, layer.self_attn.o_proj, layer.mlp.gate_up,
                                                layer.mlp.down_proj)] + [model.lm_head]


def replace_projections(model: nn.Module, make) -> None:
    """Every projection of a fused LlamaModel replaced by make(projection), in place; the unfused
    views of q/k/v and gate/up dropped with it, and the one-call stack, which held the old
    weights' addresses (models/stack.py)."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv, attn.o_proj = make(attn.qkv), make(attn.o_proj)
        mlp.gate_up, mlp.down_proj = make(mlp.gate_up), make(mlp.down_proj)
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj
    model.lm_head = make(model.lm_head)
    model.stack, model.fast_paths = None, None


def quantize_model(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """Replace every projection of a fused LlamaModel (q/k/v, o, gate/up, down, lm_head) by a
    QuantizedLinear, in place; the float weights they replace are dropped. The model is
    then for inference only (its state_dict no longer has the checkpoint's names)."""
    if mode not in QUANT_MODES:
        raise SpecdecError(f"unknown quantization {mode!r}; choose from {', '.join(QUANT_MODES)}")
    for linear in fused_projections(model):  # all or nothing: check before replacing anything
        problem = check_quantizable(linear.weight, mode, group_size)
        if problem:
            raise SpecdecError(f"cannot quantize to {mode}: {problem}")

    def quantized(linear: nn.Module) -> QuantizedLinear:
        weight = linear.weight
        return QuantizedLinear(weight, linear.bias, mode, group_for(weight.shape[1], group_size),
                               getattr(linear, "sizes", None))

    replace_projections(model, quantized)
    return model
