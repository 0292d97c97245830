"""Weights packed for oneDNN (models/packed.py): the unpacked model's outputs to rounding, and
exact mode exact on packed weights. oneDNN packs bfloat16 weights only on some CPUs (AVX-512
BW/VL/DQ or AVX-NE-CONVERT): elsewhere the bfloat16 tests skip, saying so."""
import pytest
import torch

from specdec.models import load_native
from specdec.models.bundled import DEFAULT_TARGET
from specdec.models.packed import pack_weight, packed_bytes, packing_available
from specdec.models.runner import NativeRunner
from specdec.spec.verify import tree_attention_mask

pytestmark = pytest.mark.skipif(not packing_available(), reason="no oneDNN in this PyTorch build")
bf16_packing = pytest.mark.skipif(
    packing_available() and pack_weight(torch.zeros(32, 32, dtype=torch.bfloat16)) is None,
    reason="oneDNN does not pack bfloat16 weights on this CPU (or its packed products disagree with F.linear's)")


def _passes(runner: NativeRunner, exact: bool) -> list[torch.Tensor]:
    """A prefill, decode steps, a chain and a tree pass: every kind of pass decoding makes."""
    ids = torch.randint(10, 8000, (140,), generator=torch.Generator().manual_seed(0)).tolist()
    runner.reset()
    out = [runner.extend(ids[:100])]
    out += [runner.extend([t], exact=exact) for t in ids[100:104]]
    out.append(runner.extend(ids[104:113], exact=exact))
    parents = [-1, 0, 0, 1, 2, -1]
    depths = torch.tensor([0, 1, 2, 2, 3, 3, 1])
    out.append(runner.extend(ids[113:120], attn_mask=tree_attention_mask(parents),
                             positions=runner.length + depths, exact=exact))
    return [o.clone() for o in out]


@bf16_packing
@pytest.mark.parametrize("exact", [False, True])
def test_packed_model_gives_the_unpacked_outputs(exact):
    """Packed and unpacked bf16 weights give the same outputs to bf16 rounding (another kernel
    may round differently: not asserted either way)."""
    unpacked = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 256, pack=False)
    packed = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 256)
    assert packed_bytes(packed.model) > 0
    assert packed.memory_bytes() == unpacked.memory_bytes() + packed_bytes(packed.model)
    for a, b in zip(_passes(unpacked, exact), _passes(packed, exact)):
        assert torch.allclose(a.float(), b.float(), rtol=0.05, atol=0.05 * float(a.abs().max()))


def test_packing_follows_in_place_changes_and_skips_other_dtypes():
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    assert pack_weight(weight.double()) is None
    x = torch.randn(5, 32)
    packed = pack_weight(weight)
    assert torch.allclose(packed(x), torch.nn.functional.linear(x, weight), atol=1e-5)
    with torch.no_grad():
        weight.mul_(2)  # e.g. an optimizer step: the packed copy must not go stale
    assert torch.allclose(packed(x), torch.nn.functional.linear(x, weight), atol=1e-5)


def test_float32_exact_mode_is_exact_on_packed_weights():
    """float32 packed products differ from F.linear's in the last bits, so exact mode's plans are
    checked on the packed kernel: every row of a chain and a tree pass still equals its 1-token
    pass bit for bit."""
    runner = NativeRunner(load_native(DEFAULT_TARGET, "float32"), 256)
    assert packed_bytes(runner.model) > 0
    ids = torch.randint(10, 8000, (130,), generator=torch.Generator().manual_seed(2)).tolist()
    runner.reset()
    runner.extend(ids[:100])
    chain = runner.extend(ids[100:109], exact=True).clone()
    runner.rollback(100)
    for i, t in enumerate(ids[100:109]):
        assert torch.equal(runner.extend([t], exact=True)[-1], chain[i]), i


@bf16_packing
def test_load_packs_by_default_and_no_pack_keeps_the_memory():
    import specdec
    from specdec.cli.common import add_model_args

    packed = specdec.load(method="eagle", dtype="bfloat16", calibrate=False, draft_4bit=False)  # a dense head, packed
    plain = specdec.load(method="eagle", dtype="bfloat16", calibrate=False, pack=False)
    assert packed_bytes(packed.engine.target.model) > 0 and packed_bytes(packed.engine.proposer.head) > 0
    assert packed_bytes(plain.engine.target.model) == 0 and packed_bytes(plain.engine.proposer.head) == 0
    assert plain.engine.memory_bytes() < packed.engine.memory_bytes()
    prompt = "def parse(line):\n"
    assert packed.generate(prompt, max_new_tokens=24).token_ids == plain.generate(prompt, max_new_tokens=24).token_ids
    import argparse
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    assert parser.parse_args(["--no-pack"]).pack is False and parser.parse_args([]).pack is True


def test_packing_swaps_in_packed_linears_with_the_same_parameters():
    """Packing swaps modules (PackedLinear), attaching nothing to torch's nn.Linear: the
    parameters are the same objects (state_dict keys unchanged, a tied LM head stays tied)."""
    from torch import nn

    from specdec.models.linear import PackedLinear

    model = load_native(DEFAULT_TARGET, "float32")
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    keys = list(model.state_dict())
    o_proj = model.model.layers[0].self_attn.o_proj
    runner = NativeRunner(model, 64)
    packed = runner.model.model.layers[0].self_attn.o_proj
    assert isinstance(packed, PackedLinear) and packed.weight is o_proj.weight and packed.bias is o_proj.bias
    assert isinstance(runner.model.lm_head, PackedLinear)
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
    assert list(runner.model.state_dict()) == keys
    assert not any(hasattr(m, "packed") for m in runner.model.modules() if isinstance(m, nn.Linear))
    x = torch.randn(3, o_proj.in_features)
    assert torch.allclose(packed(x), nn.functional.linear(x, o_proj.weight, o_proj.bias), atol=1e-5)
