"""Weights packed for oneDNN (models/packed.py): in bfloat16 the unpacked model's bits; in
float32 exact mode stays exact on the packed kernel."""
import pytest
import torch

from specdec.bundled import DEFAULT_TARGET
from specdec.models import load_native
from specdec.models.packed import pack_weight, packed_bytes, packing_available
from specdec.models.runner import NativeRunner
from specdec.verify import tree_attention_mask

pytestmark = pytest.mark.skipif(not packing_available(), reason="no oneDNN in this PyTorch build")


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


@pytest.mark.parametrize("exact", [False, True])
def test_packed_model_gives_the_unpacked_bits(exact):
    unpacked = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 256, pack=False)
    packed = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 256)
    assert packed_bytes(packed.model) > 0
    assert packed.memory_bytes() == unpacked.memory_bytes() + packed_bytes(packed.model)
    for a, b in zip(_passes(unpacked, exact), _passes(packed, exact)):
        assert torch.equal(a, b)


def test_packing_follows_in_place_changes_and_skips_other_dtypes():
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    assert pack_weight(weight.double()) is None
    x = torch.randn(5, 32)
    assert torch.allclose(pack_weight(weight)(x), torch.nn.functional.linear(x, weight), atol=1e-5)
    weight = weight.to(torch.bfloat16)
    packed = pack_weight(weight)
    x = torch.randn(3, 32).to(torch.bfloat16)
    assert torch.equal(packed(x), torch.nn.functional.linear(x, weight))
    with torch.no_grad():
        weight.mul_(2)  # e.g. an optimizer step: the packed copy must not go stale
    assert torch.equal(packed(x), torch.nn.functional.linear(x, weight))


def test_exact_linear_on_packed_chunks_gives_the_planned_bits():
    """SmolLM2's 1536-wide down projection in exact mode (exact.py): packed or not, every pass
    width gets the plan's bits. Its plan here pads narrow passes instead of splitting the
    reduction (cheaper, measured); a split plan packs its chunks one by one, and they must give
    the split's bits too."""
    from specdec.models.exact import PROBE_ROWS, _planned_linear, exact_linear, row_invariant_plan

    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(576, 1536, generator=g) * 0.05).to(torch.bfloat16)
    packed = pack_weight(weight)
    for m in (1, *PROBE_ROWS):
        x = torch.randn(m, 1536, generator=g).to(torch.bfloat16)
        assert torch.equal(exact_linear(x, weight, packed=packed), exact_linear(x, weight)), m
        assert torch.equal(_planned_linear(x, weight, 1024, 1, packed), _planned_linear(x, weight, 1024, 1)), m
    assert packed._chunks[1024] is not None  # the split ran on packed chunks
    assert row_invariant_plan(weight, packed) == (1536, 4)  # measured here: unsplit, 4 rows at least


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


def test_load_packs_by_default_and_no_pack_keeps_the_memory():
    import specdec
    from specdec.cli_common import add_model_args

    packed = specdec.load(method="eagle", dtype="bfloat16", calibrate=False)
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
