"""A decoder pass, embedding to logits, compiled by PyTorch's inductor (opt-in: `--compile`).

In eager mode a 1-token pass on SmolLM2 runs ~25 small ops per layer through the dispatcher,
about as long as its matrix products take. Inductor fuses the element-wise work (norms, rope,
residuals, SiLU) into a few C++ loops per layer; freezing folds the weights in as constants and
packs them once. Two graphs: 1-token passes (decoding), whose matrix-vector products run on
inductor's own C++ GEMM template where it times faster than oneDNN's kernel (ONE_ROW_GEMM),
and verify passes of 2 to MAX_ROWS tokens, on oneDNN's kernels. Quantized weights (int8/int4)
compile too: inductor lowers PyTorch's weight-only kernels to the same template (int8's 1-token
products to the template alone, INT8_ONE_ROW_GEMM).

Compiled passes are the fast (not batch-invariant) kind: their rounding differs from the eager
kernels', and a fused 1-token pass rounds differently from a fused 16-token one. So a compiled
target runs with exact=False: sampled outputs keep the target's distribution, greedy outputs
match plain decoding up to near-ties. Exact passes, passes that train and anything on other
devices run eagerly. The eager path stays the reference that tests compare the compiled one to.

Compiling SmolLM2 takes ~40 s here for the 1-token graph (timing the GEMM candidates included)
and about as long again for the graph of verify passes (calibration at load runs both), in
every process: with frozen weights inductor's on-disk cache does not apply."""
from __future__ import annotations

import contextlib
import io
import sys
import types
from collections.abc import Callable

import torch
from torch import nn

from specdec.kernels.torch_private import inductor_options
from specdec.models.cache import KVCache

# guards on the modules are skipped: checking them cost ~0.4 ms a pass here, and the weights are
# frozen constants anyway (a model is compiled once, after its last change)
COMPILE_OPTIONS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
# Under this many bytes of weights a pass is short enough that the Python wrapper inductor
# generates around its kernels shows: measured here in bfloat16, its C++ wrapper took a bundled
# 11M target's 1-token pass from ~1.10 to ~0.95 ms (+2 s of compilation), while on SmolLM2
# (270 MB, ~10 ms a pass) it made no difference beyond noise and cost 9 s more to compile.
SMALL_MODEL_BYTES = 100 * 2**20
# For 1-row products inductor picks between its C++ GEMM template and oneDNN's kernel by timing
# both on each weight shape when the graph compiles. Measured here (bf16, 2 threads, 30 layers of
# SmolLM2's shapes, weights not in cache): 8.2 ms a pass against oneDNN's 14.1 (26 against 15
# GB/s). Its kernels are tuned for the row count they were timed on, so wider passes keep
# oneDNN's (one graph for every width on the template: SmolLM2's 16-token pass 91 ms, against 34
# on oneDNN's kernels).
ONE_ROW_GEMM = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                "max_autotune_report_choices_stats": False}
# int8 weights: the template alone. Timed one shape at a time, PyTorch's `_weight_int8pack_mm`
# wins some shapes by noise-sized margins, and the pick is cached on disk for later processes;
# in the whole pass the template alone was faster (SmolLM2, 150-token context, best of 5 in one
# process, twice: 7.56 / 7.64 ms a step against 8.22 / 8.53 with both kernels; bf16 and int4: no
# difference beyond noise, so they keep the choice)
INT8_ONE_ROW_GEMM = {**ONE_ROW_GEMM, "max_autotune_gemm_backends": "CPP"}
MAX_ROWS = 128  # decode steps, chains and trees; prefill chunks run eagerly (one graph less to compile)


def use_compiled(rows: int, past: int, exact: bool, cache, device: torch.device) -> bool:
    """Whether a pass runs compiled: fast inference passes on CPU over a single sequence's cache
    after its first two tokens (sizes 0 and 1 would each compile a graph of their own; the
    batched passes, models/batch.py, run eagerly)."""
    return (not exact and type(cache) is KVCache and not torch.is_grad_enabled() and device.type == "cpu"
            and rows <= MAX_ROWS and past >= 2)


def one_row_gemm(layers: nn.ModuleList) -> dict:
    """The autotuning options of the 1-token graph for these layers' weights."""
    return INT8_ONE_ROW_GEMM if any(b.dtype == torch.int8 for b in layers.buffers()) else ONE_ROW_GEMM


def quietly(fn: Callable, *args):
    """fn(*args) with stderr held back: while autotuning, inductor writes a table of its timings
    to stderr, which a user of `specdec generate --compile` should not see. Shown if fn fails."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            return fn(*args)
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def compiled_forward(embed: nn.Module, layers: nn.ModuleList, norm: nn.Module,
                     head: Callable[[torch.Tensor], torch.Tensor], cpp_wrapper: bool = False) -> Callable:
    """run(ids, cos, sin, mask, cache) -> (logits, final-norm hidden states), compiled lazily on
    first call. The whole pass is one graph: on the bundled 11M target the embedding, the final
    norm and the LM head run eagerly took ~300 us of a 1.7 ms decode step. cpp_wrapper: the
    graph's kernels are called from generated C++ instead of Python (see SMALL_MODEL_BYTES)."""

    def run(ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
            cache) -> tuple[torch.Tensor, torch.Tensor]:
        x = embed(ids)
        for i, layer in enumerate(layers):
            x = layer(x, cos, sin, mask, cache, i)
        h = norm(x)
        return head(h), h

    def compile_copy() -> Callable:
        # dynamo keeps compiled code per code object, and the guards that would tell two models
        # apart are skipped (COMPILE_OPTIONS): each graph gets a code object of its own, so a
        # second model never runs the first one's frozen weights
        copy = types.FunctionType(run.__code__.replace(), run.__globals__, run.__name__, None, run.__closure__)
        return torch.compile(copy, dynamic=True, options={**COMPILE_OPTIONS, "cpp_wrapper": cpp_wrapper})

    # 1-token passes (decoding): `dynamic` for the cache length only; their matrix products are
    # matrix-vector products, for which inductor's own C++ GEMM template streams the weights
    # ~2x faster than oneDNN's packed kernel on this CPU (see ONE_ROW_GEMM)
    compiled_one = compile_copy()
    # verify passes: one graph for every cache length and pass width, oneDNN's kernels
    compiled_many = compile_copy()

    def call(*args) -> tuple[torch.Tensor, torch.Tensor]:
        call.passes += 1
        # freezing is read from inductor's config when a graph compiles, not from options
        if args[0].shape[1] == 1:
            # read at the first pass: the weights are quantized after the graphs are set up
            call.one_row_gemm = call.one_row_gemm or one_row_gemm(layers)
            with inductor_options(freezing=True, **call.one_row_gemm):
                out = compiled_one(*args) if call.one_compiled else quietly(compiled_one, *args)
            call.one_compiled = True
            return out
        with inductor_options(freezing=True):
            return compiled_many(*args)

    call.passes = 0  # passes run compiled (the tests check that they did)
    call.one_compiled = False
    call.one_row_gemm = None
    return call
