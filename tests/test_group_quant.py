"""--quantize int8 / int4 on the grouped kernels (specdec/models/group_quant.py): int8 rounds as
Q8_0 does (the `gguf` package's quantizer gives the same weights), int4 stays within half a step
of each weight, a quantized model runs its layers on the grouped stack (exact mode free: every
row's bits independent of the pass width), and settings the kernels lack keep PyTorch's kernels."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

import specdec
from specdec.models.group_quant import q8_0
from specdec.models.grouped import GroupedLinear
from specdec.models.grouped_weights import four_bit
from specdec.models.quant import QuantizedLinear

from helpers import make_model_dir


def weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    w[0, :32] = 0  # an all-zero group: scale 0, values 0
    return w.to(torch.bfloat16).float()


def test_int8_weights_are_the_ones_a_q8_0_gguf_holds():
    w = weight(48, 256)
    ours = q8_0(w).dequantized().numpy()
    theirs = quants.dequantize(quants.quantize(w.numpy(), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours, theirs)
    assert np.all(ours[0, :32] == 0)


@pytest.mark.parametrize("k", [256, 96])  # two-level scales (K % 128 == 0), float32 ones
def test_int4_weights_stay_within_half_a_step(k):
    w = weight(40, k, seed=1)
    g = four_bit(lambda rows: w[rows], *w.shape)
    assert g.bits == 4 and g.q.shape == (40, k // 2) and (g.scale_super is not None) == (k % 128 == 0)
    scale, _ = g.group_scales()
    step = scale.repeat_interleave(32, dim=-1)
    assert torch.all((g.dequantized() - w).abs() <= step / 2 + 1e-6)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("gq") / "m", hidden_size=128, layers=2, heads=4, kv_heads=2,
                          seed=5)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_layers_run_on_the_grouped_stack_with_the_rows_of_a_one_token_pass(folder, mode):
    decoder = specdec.load(folder, dtype="bfloat16", quantize=mode)
    target = decoder.engine.target
    model = target.model
    linears = [model.lm_head] + [layer.mlp.gate_up for layer in model.model.layers]
    assert all(isinstance(lin, GroupedLinear) for lin in linears)
    assert model.stack is not None and target.exact_is_free
    ids = list(range(3, 40))
    target.reset()
    wide = target.extend(ids)  # one pass over every token
    rows = []
    target.reset()
    for token in ids:  # one token a pass
        rows.append(target.extend([token])[-1])
    assert torch.equal(wide, torch.stack(rows))


def test_int4_groups_the_kernels_lack_keep_pytorchs_kernels(folder):
    decoder = specdec.load(folder, dtype="bfloat16", quantize="int4", group_size=64)
    assert isinstance(decoder.engine.target.model.lm_head, QuantizedLinear)
    assert decoder.engine.target.model.stack is None
