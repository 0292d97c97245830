"""A model's decoder layers in one kernel call a pass (rows.cpp `stack_forward`): on GGUF blocks
(models/grouped.py) or on dense bfloat16 / float32 weights (SmolLM2 and the bundled models).

Why: a layer's products are a few kernel calls, but the norms, rope, cache writes, attention and
residuals around them are ~90 PyTorch calls, which cost Qwen2.5-Coder-1.5B ~15 ms of a ~75 ms
1-token pass here (and its 0.5B draft, or SmolLM2's 30 thin layers, a larger share). The kernel
runs the same steps for every row on its own (elementwise work in float32, rounded once to the
model dtype; products and attention by the batch-invariant kernels), so a row's bits never depend
on the other rows of the pass: greedy speculation stays token-identical to plain decoding, in a
single sequence's pass and in a batched one alike. Where the kernels are unavailable the model
runs its PyTorch layers (models/llama.py) instead."""
from __future__ import annotations

import ctypes
import time
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from specdec.kernels import build, invariant
from specdec.kernels.invariant import address
from specdec.models.grouped_weights import Grouped

MAX_PARTS = 3  # a fused q/k/v


class Part(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("offset", ctypes.c_void_p),
                ("scale_super", ctypes.c_void_p), ("offset_super", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("rows", ctypes.c_int64), ("bits", ctypes.c_int64), ("is_signed", ctypes.c_int64),
                ("group", ctypes.c_int64), ("columns", ctypes.c_int64)]


class Projection(ctypes.Structure):
    _fields_ = [("parts", Part * MAX_PARTS), ("count", ctypes.c_int64), ("out", ctypes.c_int64)]


class Layer(ctypes.Structure):
    _fields_ = [("qkv", Projection), ("o", Projection), ("gate_up", Projection), ("down", Projection),
                ("norm_in", ctypes.c_void_p), ("norm_post", ctypes.c_void_p)]


class Dims(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64), ("pos_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64), ("eps", ctypes.c_float)]


def _int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


DENSE_BITS = {torch.bfloat16: 16, torch.float32: 32}  # rows.cpp's Part.bits for a dense weight


class LayerStack:
    """Runs the decoder layers of a model whose projections are all GroupedLinear, or all dense
    weights in the model's dtype (bfloat16 or float32), over M rows, each described by where it
    writes and which keys it sees (a chain, a tree or a batch's slots)."""

    def __init__(self, layers: list[nn.Module], config, dtype: torch.dtype, lib: ctypes.CDLL,
                 final_norm: nn.Module | None = None):
        c = config
        self.lib, self.dtype = lib, dtype
        self.keep: list[torch.Tensor] = []  # tensors whose addresses the structures hold
        self._arrays: dict[int, tuple[weakref.ref, ctypes.Array]] = {}  # caches' buffer addresses (_pointers)
        # the model's final norm, applied by the same call (its output: the final hidden states)
        self.final_norm = None if final_norm is None else self._float32(final_norm.weight)
        self.layers = (Layer * len(layers))()
        for spec, layer in zip(self.layers, layers):
            attn, mlp = layer.self_attn, layer.mlp
            for field, linear in (("qkv", attn.qkv), ("o", attn.o_proj), ("gate_up", mlp.gate_up),
                                  ("down", mlp.down_proj)):
                self._projection(getattr(spec, field), linear)
            spec.norm_in = self._float32(layer.input_layernorm.weight)
            spec.norm_post = self._float32(layer.post_attention_layernorm.weight)
        self.dims = Dims(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                         c.intermediate_size, 0, 0, c.rms_norm_eps)
        self.head_dim = c.head_dim

    def _float32(self, t: torch.Tensor) -> int:
        t = t.detach().to(torch.float32).contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def _projection(self, spec: Projection, linear) -> None:
        if not hasattr(linear, "parts"):  # a dense weight (FusedLinear, PackedLinear, nn.Linear): one part
            weight = linear.weight.detach()
            bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).contiguous()
            self.keep.extend(t for t in (weight, bias) if t is not None)
            spec.count, spec.out = 1, weight.shape[0]
            spec.parts[0] = Part(weight.data_ptr(), None, None, None, None, address(bias), weight.shape[0],
                                 DENSE_BITS[weight.dtype], 0, 0, 0)
            return
        spec.count, spec.out = len(linear.parts), linear.out_features
        for i, (part, bias) in enumerate(zip(linear.parts, linear.part_biases)):
            self.keep.extend(t for t in (*part.tensors, bias) if t is not None)
            spec.parts[i] = Part(part.q.data_ptr(), part.scale.data_ptr(), address(part.offset),
                                 address(part.scale_super), address(part.offset_super), address(bias),
                                 part.shape[0], part.bits, int(part.q.dtype == torch.int8), part.group,
                                 int(part.columns))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, rope, keys: list[torch.Tensor],
                 values: list[torch.Tensor], base: list[int], write: list[int], count: list[int] | torch.Tensor,
                 lists: invariant.KeyLists | None = None) -> torch.Tensor:
        """x [M, hidden] through every layer and the final norm, where the stack has one (a new
        tensor); row m at rope position positions[m] writes cache position write[m] of the sequence
        base[m] elements into each layer's cache and attends to its first count[m] positions, or to
        those lists gives it."""
        x = x.to(self.dtype, copy=True).contiguous()
        positions = positions.to(torch.int64).contiguous()
        # whole tables, each row's read at its position in the call (not gathered here: ~25 us)
        cos, sin = rope.tables(int(positions.max()) + 1, torch.float32, x.device)
        self.dims.pos_stride, self.dims.head_stride = keys[0].stride(2), keys[0].stride(1)
        key_ptrs, value_ptrs = self._pointers(keys), self._pointers(values)
        rows = [_int64s(base), _int64s(write)]  # held until the call returns
        if not isinstance(count, torch.Tensor):
            rows.append(_int64s(count))
        counts = count.data_ptr() if isinstance(count, torch.Tensor) else ctypes.addressof(rows[2])
        failed = self.lib.stack_forward(
            ctypes.addressof(self.layers), len(self.layers), ctypes.addressof(self.dims), x.data_ptr(),
            int(x.dtype == torch.bfloat16), x.shape[0], cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
            ctypes.addressof(key_ptrs),
            ctypes.addressof(value_ptrs), ctypes.addressof(rows[0]), ctypes.addressof(rows[1]), counts,
            None if lists is None else lists.start.data_ptr(), None if lists is None else lists.index.data_ptr(),
            self.final_norm)
        if failed:
            raise RuntimeError("stack_forward met a weight layout its products lack (checked at load)")
        return x

    def _pointers(self, buffers: list[torch.Tensor]) -> ctypes.Array:
        """The addresses of a cache's per-layer buffers, kept per list: a cache's lists and their
        tensors never change (writes, rollbacks and moves are in place), and building the array
        was ~25 us a pass, cold after the weights streamed through the caches. A list is known
        by its id and its first tensor, held weakly (a dead one, or another, misses)."""
        entry = self._arrays.get(id(buffers))
        if entry is not None and entry[0]() is buffers[0] and len(entry[1]) == len(buffers):
            return entry[1]
        if len(self._arrays) >= 64:  # caches come and go (forks, batches): keep the recent ones
            self._arrays.clear()
        array = (ctypes.c_void_p * len(buffers))(*[t.data_ptr() for t in buffers])
        self._arrays[id(buffers)] = (weakref.ref(buffers[0]), array)
        return array

    def extend(self, x: torch.Tensor, positions: torch.Tensor, rope, cache,
               lists: invariant.KeyLists | None = None) -> torch.Tensor:
        """x [T, hidden] through the layers as the next T entries of one sequence's cache (a
        KVCache with a layout), each row attending causally or to the positions lists gives it;
        the cache advances by T. Returns the last layer's output, through the final norm where the
        stack has one."""
        past, T = cache.length, x.shape[0]
        if past + T > cache.max_len:
            raise ValueError(f"KV cache overflow: {past + T} positions > capacity {cache.max_len}")
        write = list(range(past, past + T))
        count = [w + 1 for w in write] if lists is None else lists.lengths
        keys, values, base = cache.layout()
        out = self(x, positions.reshape(-1), rope, keys, values, [base] * T, write, count, lists)
        cache.advance(T)
        return out


def dense_stack(model) -> LayerStack | None:
    """The one-call stack for a model whose projections are dense weights in its own dtype
    (fused q/k/v and gate/up: LlamaModel.fuse_projections), or None where it does not apply
    (the kernels unavailable, another dtype or device, quantized or unfused projections)."""
    if model.device.type != "cpu":
        return None
    return dense_layer_stack(list(model.model.layers), model.config, model.dtype, model.model.norm)


def dense_layer_stack(layers: list[nn.Module], config, dtype: torch.dtype,
                      final_norm: nn.Module | None = None) -> LayerStack | None:
    """The one-call stack over these decoder layers (a model's, or a draft head's one layer) and
    final_norm after them, where their projections are dense, fused, contiguous weights in
    `dtype`; else None."""
    lib = build.load()
    if lib is None or dtype not in DENSE_BITS:
        return None
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is None or mlp.gate_up is None:
            return None
        for linear in (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj):
            weight = getattr(linear, "weight", None)
            if hasattr(linear, "parts") or not isinstance(weight, torch.Tensor) or weight.dtype != dtype \
                    or not weight.is_contiguous():
                return None
        if not isinstance(attn.o_proj, nn.Module) or not isinstance(mlp.down_proj, nn.Module):
            return None
    return LayerStack(layers, config, dtype, lib, final_norm)


def kernel_takes(part: Grouped) -> bool:
    """Whether rows.cpp multiplies this layout (one probe row)."""
    x = torch.zeros(1, part.shape[1])
    return invariant.linear_grouped(x, part.q, part.scale, part.offset, part.group, None, None, 0, part.bits,
                                    part.scale_super, part.offset_super, part.columns) is not None


# Pass widths timed when choosing where fast passes run; a width runs as the smallest class that
# holds it (wider than the last: a prefill chunk, timed on WIDE rows).
WIDTH_CLASSES, WIDE = (1, 2, 4, 8, 16, 32), 64
# The layers take a width only where they ran at least this much faster: a width off the stack turns
# prefix reuse off (Runner.kv_rows_invariant), and one load beside another busy process (two pytest
# workers) once chose the layers for a width the stack won by 1.4-3x uncontended (SmolLM2 bf16, AMD EPYC
# Zen 5); the two ways are now also timed in turn. (Not measured on the Intel kind, where oneDNN's AMX
# may win prefill widths by more.)
LAYERS_MARGIN = 1.1


@dataclass
class FastPaths:
    """Where a fast (not exact) pass of each width class runs: True = the one-call stack, False =
    the PyTorch layers (whose products may be oneDNN's, with native bf16 or AMX where the CPU has
    them). Exact passes always take the stack: its rows are exact by construction."""

    on_stack: dict[int, bool]

    def use_stack(self, width: int) -> bool:
        return self.on_stack[next((c for c in WIDTH_CLASSES if width <= c), WIDE)]

    @property
    def stack_only(self) -> bool:
        return all(self.on_stack.values())


@torch.inference_mode()
def time_fast_paths(model, repeats: int = 3) -> FastPaths:
    """Times a pass of each width class both ways on a scratch cache (after 32 cached tokens),
    best of `repeats` after one warm-up each, on this machine and thread count: the winner differs
    by CPU (measured on an AVX2-only AMD EPYC, SmolLM2 bf16, ms at 1 / 4 / 8 / 256 tokens, before the
    products' prefetch: stack 18.4 / 29.7 / 39.4 / 725, layers 29.5 / 39.3 / 48.2 / 682; a
    CPU with native bf16 or AMX in oneDNN may favour the layers for prefill chunks)."""
    stack, cache = model.stack, model.new_cache(32 + WIDE)
    ids = torch.arange(32, device=model.device)[None] % model.config.vocab_size
    model.hidden_states(ids, cache=cache)  # through the stack: the layers path takes the same cache
    on_stack = {}
    try:
        for width in (*WIDTH_CLASSES, WIDE):
            new = torch.arange(width, device=model.device)[None] % model.config.vocab_size
            seconds = {True: float("inf"), False: float("inf")}
            for i in range(repeats + 1):  # the two ways in turn: a burst of other work hits both
                for use in (True, False):
                    model.stack = stack if use else None
                    cache.rollback(32)
                    t0 = time.perf_counter()
                    model.hidden_states(new, cache=cache)
                    if i:
                        seconds[use] = min(seconds[use], time.perf_counter() - t0)
            on_stack[width] = seconds[False] * LAYERS_MARGIN >= seconds[True]
    finally:
        model.stack = stack
    return FastPaths(on_stack)
