"""A decoder pass, embedding to logits, compiled by PyTorch's inductor (opt-in: `--compile`).

In eager mode a 1-token pass on SmolLM2 runs ~25 small ops per layer through the dispatcher,
about as long as its matrix products take. Inductor fuses the element-wise work (norms, rope,
residuals, SiLU) into a few C++ loops per layer; freezing folds the weights in as constants and
packs them for oneDNN once, as models/packed.py does for the eager path.

Compiled passes are the fast (not batch-invariant) kind: their rounding differs from the eager
kernels', and a fused 1-token pass rounds differently from a fused 16-token one. So a compiled
target runs with exact=False: sampled outputs keep the target's distribution, greedy outputs
match plain decoding up to near-ties. Exact passes, passes that train and anything on other
devices run eagerly. The eager path stays the reference that tests compare the compiled one to.

Compiling SmolLM2 takes ~35 s here for the graph of 1-token passes and about as long again for
the graph of verify passes (calibration at load runs both), in every process: with frozen
weights inductor's on-disk cache does not apply (a second process measured no faster)."""
from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch._inductor.config as inductor_config
from torch import nn

from specdec.cache import KVCache

# guards on the modules are skipped: checking them cost ~0.4 ms a pass here, and the weights are
# frozen constants anyway (a model is compiled once, after its last change)
COMPILE_OPTIONS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
# Under this many bytes of weights a pass is short enough that the Python wrapper inductor
# generates around its kernels shows: measured here in bfloat16, its C++ wrapper took a bundled
# 11M target's 1-token pass from ~1.10 to ~0.95 ms (+2 s of compilation), while on SmolLM2
# (270 MB, ~10 ms a pass) it made no difference beyond noise and cost 9 s more to compile.
SMALL_MODEL_BYTES = 100 * 2**20
MAX_ROWS = 128  # decode steps, chains and trees; prefill chunks run eagerly (one graph less to compile)


def use_compiled(rows: int, past: int, exact: bool, cache, device: torch.device) -> bool:
    """Whether a pass runs compiled: fast inference passes on CPU over a single sequence's cache
    after its first two tokens (sizes 0 and 1 would each compile a graph of their own; the
    batched passes, models/batch.py, run eagerly)."""
    return (not exact and type(cache) is KVCache and not torch.is_grad_enabled() and device.type == "cpu"
            and rows <= MAX_ROWS and past >= 2)


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

    # dynamo keeps compiled code per code object, and the guards that would tell two models
    # apart are skipped (COMPILE_OPTIONS): each model gets a code object of its own, so a second
    # model never runs the first one's frozen weights
    run = types.FunctionType(run.__code__.replace(), run.__globals__, run.__name__, None, run.__closure__)
    # dynamic: one graph for every cache length and pass width instead of one per size
    compiled = torch.compile(run, dynamic=True, options={**COMPILE_OPTIONS, "cpp_wrapper": cpp_wrapper})

    def call(*args) -> tuple[torch.Tensor, torch.Tensor]:
        call.passes += 1
        # freezing is read from inductor's config when a graph compiles, not from options
        with inductor_config.patch(freezing=True):
            return compiled(*args)

    call.passes = 0  # passes run compiled (the tests check that they did)
    return call
