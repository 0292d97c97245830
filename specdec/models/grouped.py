"""A GGUF model (llama or qwen2) run on its own quantized blocks (`--quantize gguf`): every projection keeps the
file's format (Q4_K, Q6_K, Q5_0, Q8_0, ...), unpacked once into int8 values with per-group
scales (models/gguf_blocks.py), multiplied by the batch-invariant grouped kernel
(kernels/rows.cpp). No float copy of the weights is ever made: the model is built on the meta
device and each tensor is unpacked straight from the memory-mapped file, so memory is about
1.1-1.25 bytes per weight. The embedding table dequantizes only the rows a pass looks up.

The weights are exactly those llama.cpp dequantizes; activations stay in the model dtype
(bfloat16 or float32), so outputs differ from llama.cpp's (which quantizes activations to
8 bits) by rounding. Every row's bits are independent of the pass width, so exact mode costs
nothing here: greedy speculation is token-identical to plain decoding on these weights."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from specdec.errors import SpecdecError
from specdec.kernels import build, invariant
from specdec.models.config import ModelConfig
from specdec.models.exact import rows_alone
from specdec.models.gguf import PERMUTED_ARCHITECTURES, GGUFFile, hf_config, unpermute_qk
from specdec.models.gguf_blocks import FOUR_BIT_FORMATS, GROUPED_FORMATS, requantized_4bit, unpack
from specdec.models.grouped_weights import Grouped, for_kernels
from specdec.models.grouped_weights import four_bit as rounded_4bit
from specdec.models.llama import LlamaModel
from specdec.models.rope import RopeTable, rope_inv_freq
from specdec.models.stack import MAX_PARTS, LayerStack, kernel_takes

FLOAT_FORMATS = ("F32", "F16", "BF16")


class GroupedLinear(nn.Module):
    """y = x @ W.T (+ bias) for one or several projections of the same input (a fused q/k/v or
    gate/up), each in its own grouped format; their outputs side by side. sizes: split the
    output as FusedLinear does; None returns one tensor."""

    def __init__(self, parts: list[Grouped], bias: torch.Tensor | None, dtype: torch.dtype, split: bool):
        super().__init__()
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("fused projections need the same number of inputs")
        self.parts = parts = [for_kernels(p) for p in parts]
        for i, part in enumerate(parts):  # buffers too, so that the model's memory counts them
            _register(self, f"part{i}", part)
        self.bias = None if bias is None else bias.to(torch.float32).contiguous()
        self.dtype = dtype
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        self.sizes = [p.shape[0] for p in parts] if split else None
        starts = [sum(p.shape[0] for p in parts[:i]) for i in range(len(parts))]
        self.columns = starts  # where each part's outputs go
        self.part_biases = [None if self.bias is None else self.bias[c:c + p.shape[0]] for c, p in zip(starts, parts)]

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        y = self.product(x, exact)
        return y if self.sizes is None else y.split(self.sizes, dim=-1)

    def product(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The output unsplit. Every row is computed alike at any width (the kernel's
        construction, or a row at a time without it), so exact costs nothing extra."""
        rows = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=self.dtype)
        for part, bias, column in zip(self.parts, self.part_biases, self.columns):
            if invariant.linear_grouped(rows, part.q, part.scale, part.offset, part.group, bias, out, column,
                                        part.bits, part.scale_super, part.offset_super, part.columns) is None:
                n = part.shape[0]
                out[:, column:column + n] = rows_alone(lambda row, p=part, b=bias: self._dequantized_product(row, p, b),
                                                       rows)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _dequantized_product(self, row: torch.Tensor, part: Grouped, bias: torch.Tensor | None) -> torch.Tensor:
        """Where the kernels are unavailable: the weight dequantized for this call (slow, memory
        kept low)."""
        return F.linear(row, part.dequantized().to(self.dtype), None if bias is None else bias.to(self.dtype))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def grouped_stack(model) -> LayerStack | None:
    """The one-call stack for a model on GGUF blocks, or None where it does not apply (the
    kernels unavailable, another dtype, a projection the kernels cannot multiply)."""
    lib = build.load()
    if lib is None or model.dtype not in (torch.bfloat16, torch.float32) or model.device.type != "cpu":
        return None
    for layer in model.model.layers:
        linears = (layer.self_attn.qkv, layer.self_attn.o_proj, layer.mlp.gate_up, layer.mlp.down_proj)
        if not all(isinstance(lin, GroupedLinear) and len(lin.parts) <= MAX_PARTS for lin in linears):
            return None
        if not all(kernel_takes(part) for lin in linears for part in lin.parts):
            return None
    return LayerStack(list(model.model.layers), model.config, model.dtype, lib, model.model.norm)


class GroupedEmbedding(nn.Module):
    """An embedding table kept in its grouped format: a lookup dequantizes its rows."""

    def __init__(self, table: Grouped, dtype: torch.dtype):
        super().__init__()
        self.table, self.dtype = table, dtype
        self.num_embeddings, self.embedding_dim = table.shape
        _register(self, "table", table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        return self.table.dequantized(flat).to(self.dtype).reshape(*ids.shape, self.embedding_dim)


RECENT_ROWS = 2048  # embedding rows a FileEmbedding keeps: a text's recent tokens recur


class FileEmbedding(nn.Module):
    """An untied embedding table left in the GGUF file: a lookup reads its rows' blocks from the
    file and dequantizes them (gguf's dequantize, the values GroupedEmbedding gives), so the
    table takes no memory of the process (both Qwen2.5-Coder tables: ~210 MB). Read, not
    memory-mapped: the kernel maps the pages around each faulting row too (~64 KB), so a map held
    ~100 MB resident after six prompts' worth of distinct tokens. The RECENT_ROWS rows looked up
    last are kept (dequantized; 3.6 / 6.3 MB for the 0.5B / 1.5B): a decode step's one-row lookup
    through the file and gguf's dequantize took ~0.5 ms, once a target step and a drafted token.
    The recent rows' values are what a read gives: the same bits."""

    def __init__(self, tensor, dtype: torch.dtype):
        super().__init__()
        _check_format(tensor)
        self.path, self.kind, self.dtype = tensor.path, tensor.tensor_type, dtype
        self.num_embeddings, self.embedding_dim = _shape(tensor)
        self.row_bytes = tensor.n_bytes // self.num_embeddings
        self.data_offset = tensor.data_offset
        self.recent: OrderedDict[int, torch.Tensor] = OrderedDict()  # token -> its row, least recent first

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        low, high = (int(flat.min()), int(flat.max())) if flat.numel() else (0, 0)
        if not 0 <= low <= high < self.num_embeddings:
            raise IndexError(f"token ids must lie in [0, {self.num_embeddings}); got {low}..{high}")
        tokens = flat.tolist()
        fresh = self._read(sorted({t for t in tokens if t not in self.recent}))
        rows = []
        for t in tokens:  # kept in the order of use: the least recently used goes first
            row = fresh.get(t)
            if row is None:
                row = self.recent[t]
            self.recent[t] = row
            self.recent.move_to_end(t)
            rows.append(row)
        while len(self.recent) > RECENT_ROWS:
            self.recent.popitem(last=False)
        out = torch.stack(rows) if rows else torch.empty(0, self.embedding_dim, dtype=self.dtype)
        return out.reshape(*ids.shape, self.embedding_dim)

    def _read(self, tokens: list[int]) -> dict[int, torch.Tensor]:
        """The rows of `tokens` (ascending), read from the file and dequantized."""
        from gguf.quants import dequantize

        if not tokens:
            return {}
        rows = np.empty((len(tokens), self.row_bytes), dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:  # opened per lookup: no descriptor outlives a call
            for row, token in zip(rows, tokens):
                f.seek(self.data_offset + token * self.row_bytes)
                if f.readinto(row) != self.row_bytes:
                    raise SpecdecError(f"GGUF {str(self.path)!r} ends inside token {token}'s embedding row "
                                       "(truncated file?)")
        values = torch.from_numpy(dequantize(rows, self.kind).astype(np.float32, copy=False)).to(self.dtype)
        return dict(zip(tokens, values.unbind(0)))


def _register(module: nn.Module, name: str, part: Grouped) -> None:
    for field in ("q", "scale", "offset", "scale_super", "offset_super"):
        module.register_buffer(f"{name}_{field}", getattr(part, field), persistent=False)


def _shape(tensor) -> tuple[int, ...]:
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def _grouped(path, tensor, in_4bit: bool = False, rows_per_read: int = 128) -> Grouped:
    """A GGUF tensor's blocks in the grouped layout, unpacked rows_per_read rows at a time (each
    slice's temporaries a few MB, reused from the heap: heap.py); in_4bit: byte-a-value formats
    rounded to 4 bits (grouped_weights.four_bit) slice by slice as they are read, so neither the
    file's bytes nor the byte-a-value form is ever held whole (the 0.5B draft's head: ~280 MB)."""
    _check_format(tensor)
    kind, (N, K) = tensor.tensor_type.name, _shape(tensor)
    row_bytes = int(tensor.n_bytes) // N

    def read(rows: slice) -> Grouped:
        start, stop, _ = rows.indices(N)
        # read, not memory-mapped: the file's pages then stay out of the process's resident memory
        raw = np.fromfile(path, dtype=np.uint8, count=(stop - start) * row_bytes,
                          offset=int(tensor.data_offset) + start * row_bytes)
        return unpack(kind, raw, (stop - start, K), rows_per_call=rows_per_read)

    if in_4bit and _roundable(kind, K):
        return rounded_4bit(lambda rows: read(rows).dequantized(), N, K, rows_per_read)
    return read(slice(None))


def _roundable(kind: str, K: int) -> bool:
    """Whether a draft's tensor of this format and width is rounded to 4 bits (its values stored
    a byte each; groups of 32)."""
    return kind not in FOUR_BIT_FORMATS and K % 32 == 0


def _check_format(tensor) -> None:
    kind = tensor.tensor_type.name
    if kind in GROUPED_FORMATS:
        return
    if kind in FLOAT_FORMATS:
        raise SpecdecError(f"GGUF tensor {tensor.name!r} is {kind}; --quantize gguf needs quantized projections "
                           "(load this file without --quantize, or with --quantize int8/int4)")
    raise SpecdecError(f"GGUF tensor {tensor.name!r} has type {kind}, which --quantize gguf does not load "
                       f"(supported: {', '.join(GROUPED_FORMATS)})")


def _float(tensor, dtype: torch.dtype) -> torch.Tensor:
    from specdec.models.gguf import dequantize

    return dequantize(tensor).to(dtype)


def load_grouped(g: GGUFFile, dtype: torch.dtype, four_bit: bool = False) -> LlamaModel:
    """A LlamaModel whose projections and embedding keep the GGUF's quantized blocks; norms and
    biases in `dtype` (float32 for the biases, which the kernel adds before its one rounding).
    four_bit (a draft model): projections stored a value a byte (Q5_0, Q8_0, Q6_K) rounded to 4
    bits as each is read (gguf_blocks.requantized_4bit); the embedding's lookups keep the file's."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise SpecdecError(f"--quantize gguf runs in bfloat16 or float32, not {dtype}")
    config = ModelConfig.from_hf_dict(hf_config(g))
    tensors = {t.name: t for t in g.tensors}
    heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}

    def projection(name: str) -> Grouped:
        kind = name.split(".")[-2].removeprefix("attn_")
        if g.architecture not in PERMUTED_ARCHITECTURES or kind not in heads:
            return _grouped(g.path, tensors[name], four_bit)
        part = _grouped(g.path, tensors[name])  # llama.cpp's row order -> HF's, then rounded
        q, scale, offset, scale_super, offset_super = (None if t is None else unpermute_qk(t, heads[kind])
                                                       for t in part.tensors)
        part = Grouped(q, scale, offset, part.group, part.bits, scale_super, offset_super)
        return requantized_4bit(part) if four_bit and _roundable(tensors[name].type_name, part.shape[1]) else part

    with torch.device("meta"):
        model = LlamaModel(config)
    model.rope = RopeTable(rope_inv_freq(config))
    head = tensors.get("output.weight")
    if head is None:  # tied: one table for the lookups and the head
        embedding = for_kernels(_grouped(g.path, tensors["token_embd.weight"]))
        model.model.embed_tokens = GroupedEmbedding(embedding, dtype)
    else:
        model.model.embed_tokens = FileEmbedding(tensors["token_embd.weight"], dtype)
    model.lm_head = GroupedLinear([_grouped(g.path, head, four_bit) if head is not None else embedding], None, dtype,
                                  split=False)
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        name = f"blk.{i}."
        biases = [tensors.get(f"{name}attn_{p}.bias") for p in "qkv"]
        bias = torch.cat([_float(b, torch.float32) for b in biases]) if all(b is not None for b in biases) else None
        attn.qkv = GroupedLinear([projection(f"{name}attn_{p}.weight") for p in "qkv"], bias, dtype, split=True)
        attn.o_proj = GroupedLinear([projection(f"{name}attn_output.weight")], None, dtype, split=False)
        mlp.gate_up = GroupedLinear([projection(f"{name}ffn_{p}.weight") for p in ("gate", "up")], None, dtype,
                                    split=True)
        mlp.down_proj = GroupedLinear([projection(f"{name}ffn_down.weight")], None, dtype, split=False)
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj
        layer.input_layernorm.weight = nn.Parameter(_float(tensors[f"{name}attn_norm.weight"], dtype), False)
        layer.post_attention_layernorm.weight = nn.Parameter(_float(tensors[f"{name}ffn_norm.weight"], dtype), False)
    model.model.norm.weight = nn.Parameter(_float(tensors["output_norm.weight"], dtype), False)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise SpecdecError(f"GGUF {str(g.path)!r} lacks tensors for {left[:5]}")
    model.stack = grouped_stack(model)
    return model.eval()
