"""row_attention's bf16 decode-step kernel: it is built on this machine (so the suite runs it),
it computes float32 attention over the bf16 cache as exact.attend_row's reference does (to
bf16's rounding of the output), on cache slices, grouped heads, several sequences and key
counts around its chunk size, and plain decoding calls it inside compiled graphs."""
import copy

import pytest
import torch
import torch.nn.functional as F

import specdec
from specdec.models import LlamaModel, ModelConfig, row_attention
from specdec.models.exact import attend_row
from specdec.models.runner import NativeRunner


def _case(B: int, nh: int, nkv: int, hd: int, L: int, capacity: int = 1100, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cache_k, cache_v = (torch.randn(B, nkv, capacity, hd, generator=g).bfloat16() for _ in range(2))
    q = (torch.randn(B, nh, 1, hd, generator=g) * 2).bfloat16()
    return q, cache_k[:, :, :L], cache_v[:, :, :L]  # keys as decoding passes them: a slice of the cache


def _bf16_step(want: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """How far a float32 attention rounded once to bf16 may be from the float64 one: one bf16
    step (2^-8 relative), plus float32's summation error where the weighted values cancel to
    near zero (relative to the values' scale)."""
    return want.abs() * 2.0 ** -7 + v.abs().max().double() * 2.0 ** -16


def test_the_kernel_builds_here():
    q, k, v = _case(1, 9, 3, 64, 10)
    row_attention.attend_row_bf16(q, k, v)
    assert row_attention.kernel_error() is None
    assert row_attention._kernel() is not None


@pytest.mark.parametrize("B,nh,nkv,hd,L", [(1, 9, 3, 64, 1), (1, 9, 3, 64, 17), (1, 9, 3, 64, 256), (1, 9, 3, 64, 257),
                                           (1, 9, 3, 64, 1000), (1, 5, 1, 64, 300), (2, 4, 4, 32, 600),
                                           (3, 8, 2, 128, 40)])
def test_kernel_equals_float32_attention_to_bf16_rounding(B, nh, nkv, hd, L):
    q, k, v = _case(B, nh, nkv, hd, L, seed=L)
    assert row_attention.supports(q, k)
    got = row_attention.attend_row_bf16(q, k, v)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=nkv != nh)
    reference = row_attention.reference_attend_row(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    step = _bf16_step(want, v)
    assert ((got.double() - want).abs() <= step).all()
    assert ((got.double() - reference.double()).abs() <= step).all()


def test_attend_row_takes_the_kernel_only_where_it_applies():
    q, k, v = _case(1, 9, 3, 64, 50)
    assert torch.equal(attend_row(q, k, v), row_attention.attend_row_bf16(q, k, v))
    for q2, k2 in ((q.float(), k.float()), (q[..., :48], k[..., :48]), (q.expand(1, 9, 2, 64), k)):
        assert not row_attention.supports(q2, k2)
    assert not row_attention.supports(q, k.transpose(2, 3))


def _kernel_calls(profile) -> int:
    return sum(1 for e in profile.events() if e.name == "specdec::attend_row_bf16")


def test_eager_bf16_decoding_calls_the_kernel_in_every_layer(monkeypatch):
    """Fast (not exact) bf16 decoding, eager, calls the kernel once per layer and step, and the
    float32 copy path where the kernel does not apply. Their outputs agree to rounding
    (test_kernel_equals_float32_attention_to_bf16_rounding); their greedy tokens are not compared:
    two summation orders may pick different tokens at near-ties, on some CPUs and not others."""
    prompt = "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n"
    decoder = specdec.load(method="none", dtype="bfloat16", exact=False, calibrate=False)
    decoder.engine.target.model.stack = None  # the PyTorch layers (where they time faster than models/stack.py)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = decoder.generate(prompt, max_new_tokens=16, ignore_eos=True).token_ids
    assert _kernel_calls(profile) >= 15 * 8  # a call per layer (8) in each decode step
    monkeypatch.setattr(row_attention, "supports", lambda q, k: False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        want = decoder.generate(prompt, max_new_tokens=16, ignore_eos=True).token_ids
    assert _kernel_calls(profile) == 0
    assert len(got) == len(want) == 16


def test_compiled_bf16_passes_call_the_kernel_inside_their_graph():
    """A small random bf16 model, compiled without timing GEMM kernels (the bundled target with
    them took ~40 s here): its 1-token passes call the op inside the graph, and their logits
    stay within 5% of the largest eager logit (compiled and eager passes round differently)."""
    config = ModelConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaModel(config).to(torch.bfloat16).eval()
    eager = NativeRunner(copy.deepcopy(model), 256)
    compiled = NativeRunner(model, 256, compile=True)
    compiled.model.compiled.one_row_gemm = {"max_autotune": False}  # timing GEMM kernels is what takes long
    for runner in (compiled, eager):
        runner.extend(list(range(1, 40)))
        runner.extend([4])  # the 1-token graph compiles here
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = [compiled.extend([t]) for t in (5, 6, 7)]
    want = [eager.extend([t]) for t in (5, 6, 7)]
    assert compiled.model.compiled.one_compiled
    assert _kernel_calls(profile) == 3 * 2  # a call per layer and pass
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=0.05, atol=0.05 * float(b.float().abs().max()))
