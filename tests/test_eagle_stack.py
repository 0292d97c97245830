"""The EAGLE head's layer through the one-call stack (models/stack.py) computes what its PyTorch
layer does: the causal catch-up pass and a tree pass with its mask, and the cache it leaves."""
import copy

import pytest
import torch

from specdec.kernels import build
from specdec.models.config import ModelConfig
from specdec.spec.proposers.eagle_head import EagleHead


@pytest.mark.skipif(build.load() is None, reason=f"kernels unavailable: {build.unavailable()}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_head_on_the_stack_matches_its_pytorch_layer(dtype):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    eager = EagleHead(config).to(dtype).eval()
    with torch.no_grad():  # norms away from 1, so that a skipped one would show
        for p in eager.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stacked = copy.deepcopy(eager).pack_weights()
    eager.pack_weights().stack = None
    assert stacked.stack is not None
    feats, embeds = (torch.randn(1, 7, 64).to(dtype) for _ in range(2))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.05, rtol=0.05)
    outs = []
    with torch.inference_mode():
        for head in (eager, stacked):
            cache = head.new_cache(32)
            catch_up = head(feats[:, :5], embeds[:, :5], torch.arange(5), cache)
            mask = torch.zeros(2, 7, dtype=torch.bool)  # two siblings: the prefix, each itself
            mask[:, :5] = True
            mask[0, 5] = mask[1, 6] = True
            tree = head(feats[:, 5:], embeds[:, 5:], torch.full((2,), 5), cache, mask)
            outs.append((catch_up, tree, cache.keys[0][0, :, :7].clone(), cache.length))
    (a1, b1, k1, n1), (a2, b2, k2, n2) = outs
    assert n1 == n2 == 7
    assert torch.allclose(a1.float(), a2.float(), **tol)
    assert torch.allclose(b1.float(), b2.float(), **tol)
    assert torch.allclose(k1.float(), k2.float(), **tol)


@pytest.mark.skipif(build.load() is None, reason=f"kernels unavailable: {build.unavailable()}")
def test_a_head_rounded_to_4bit_predicts_what_its_float_weights_nearly_do():
    """round_to_4bit: every projection on the grouped kernels, the layer on the grouped stack, a
    fraction of the bytes; its predicted features close to the float head's (a draft: only its
    acceptance depends on them)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    dense = EagleHead(config, draft_vocab=32).to(torch.bfloat16).eval()
    rounded = copy.deepcopy(dense).pack_weights()
    dense.pack_weights()
    assert rounded.round_to_4bit() and rounded.four_bit and not dense.four_bit
    projections = (rounded.fc, rounded.lm_head, rounded.layer.self_attn.qkv, rounded.layer.mlp.down_proj)
    assert all(type(lin).__name__ == "GroupedLinear" for lin in projections)
    feats, embeds = (torch.randn(1, 9, 64).to(torch.bfloat16) for _ in range(2))
    with torch.inference_mode():
        want, got = (head(feats, embeds, torch.arange(9), head.new_cache(16)) for head in (dense, rounded))
    assert got.shape == want.shape and torch.isfinite(got.float()).all()
    error = (got.float() - want.float()).norm() / want.float().norm()
    assert 0 < error < 0.2, error  # rounded (not the float weights), yet close
    unpacked = EagleHead(config).to(torch.bfloat16).eval()
    assert not unpacked.round_to_4bit() and not unpacked.four_bit  # the stack needs the packed head


def test_draft_4bit_rounds_the_eagle_head_by_default_and_output_stays_plain_decodings():
    """--draft-4bit for EAGLE (on by default where the kernels take the head): greedy output is
    plain decoding's either way; --draft-4bit on a Medusa head is refused with a clear error."""
    import specdec
    from specdec.errors import SpecdecError

    prompt = "def fib(n):\n    if n < 2:\n        return n\n"
    plain = specdec.load(dtype="bfloat16").generate(prompt, max_new_tokens=24).token_ids
    for option in (None, False):
        decoder = specdec.load(method="eagle", dtype="bfloat16", draft_4bit=option, memory=False)
        assert decoder.engine.proposer.head.four_bit == (option is None and build.load() is not None)
        result = decoder.generate(prompt, max_new_tokens=24)
        assert result.token_ids == plain and result.stats.drafted_tokens > 0
    with pytest.raises(SpecdecError, match="not a medusa head"):
        specdec.load(method="medusa", dtype="bfloat16", draft_4bit=True)


def test_past_its_window_the_eagle_head_restarts_from_the_last_features(tmp_path, monkeypatch):
    """A prompt with more features than the head reads at once: the head restarts from the last
    HEAD_WINDOW positions (its cache rows from 0, rope at their own positions), drafts, and the
    output stays plain decoding's; its cache never holds more than twice the window (plus a tree)."""
    import specdec
    from specdec.spec.proposers import eagle

    from helpers import make_eagle_dir, make_model_dir
    monkeypatch.setattr(eagle, "HEAD_WINDOW", 16)
    target = make_model_dir(tmp_path / "t", layers=2, kv_heads=1, max_pos=512)
    head = make_eagle_dir(tmp_path / "e", target)
    spec = specdec.load(target=target, draft=head, method="eagle", dtype="float64", draft_tokens=4, calibrate=False,
                        tree_lookup=False)
    plain = specdec.load(target=target, dtype="float64", calibrate=False)
    prompt = "def add(a, b):\n    return a + b\n" * 6  # ~100 tokens
    lengths = []
    for params in (dict(temperature=0), dict(temperature=0.9, seed=2)):
        got = spec.generate(prompt, max_new_tokens=48, ignore_eos=True, **params)
        assert got.token_ids == plain.generate(prompt, max_new_tokens=48, ignore_eos=True, **params).token_ids
        assert got.stats.drafted_tokens > 0
        proposer = spec.engine.proposer
        lengths.append((proposer.offset, proposer.committed))
    assert all(offset > 0 and committed <= 32 for offset, committed in lengths)
