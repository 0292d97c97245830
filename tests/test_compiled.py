"""The layers compiled by inductor (models/compiled.py): every kind of fast pass agrees with the
eager reference, two compiled models in one process keep their own weights, and the API refuses
what compiling cannot honour. Compiling the bundled target took ~10-20 s on an AVX-512 machine;
on an AVX2-only AMD EPYC the first test below took 108 s (two test workers running), most of it
inductor generating its GEMM templates, so the tests that compile run in the slow tier."""
import sys

import pytest
import torch

import specdec
from specdec.errors import SpecdecError
from specdec.models import load_native
from specdec.models.bundled import DEFAULT_TARGET
from specdec.models.compiled import INT8_ONE_ROW_GEMM, ONE_ROW_GEMM, quietly
from specdec.models.runner import NativeRunner
from tests.test_packed import _passes


def _runner(compile: bool, down_scale: float = 1.0) -> NativeRunner:
    model = load_native(DEFAULT_TARGET, "float32")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(down_scale)
    return NativeRunner(model, 256, compile=compile)


@pytest.mark.slow  # compiling is slow on some CPUs: see the module docstring
def test_compiled_passes_match_eager_and_models_keep_their_weights():
    for scale in (1.0, 0.5):  # the same code compiled twice in one process: each model its own weights
        compiled, eager = _runner(True, scale), _runner(False, scale)
        for a, b in zip(_passes(compiled, exact=False), _passes(eager, exact=False), strict=True):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
        assert compiled.model.compiled.passes >= 6  # decode steps, the chain and the tree ran compiled
        assert compiled.model.compiled.one_row_gemm is ONE_ROW_GEMM  # float weights: the timed choice
        assert eager.model.compiled is None


@pytest.mark.slow  # compiling is slow on some CPUs: see the module docstring
def test_compiled_speculative_greedy_output_equals_eager_plain_decoding():
    plain = specdec.load(method="none", calibrate=False)
    compiled = specdec.load(method="ngram", compile=True, calibrate=False, draft_tokens=4)
    assert not compiled.exact
    for prompt in ("def parse_args(argv):\n    parser = argparse.ArgumentParser()\n",
                   "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"):
        want = plain.generate(prompt, max_new_tokens=48).token_ids
        got = compiled.generate(prompt, max_new_tokens=48)
        assert got.token_ids == want
        assert got.stats.accepted_tokens > 0


@pytest.mark.slow  # compiling is slow on some CPUs: see the module docstring
def test_compiled_int8_greedy_output_equals_eager_int8_and_decoding_runs_the_one_row_graph(monkeypatch):
    """Quantized weights compile too (inductor lowers the int8 kernel to its own template); the
    eager reference on the same PyTorch int8 kernels (not the grouped ones --quantize loads)."""
    monkeypatch.setattr("specdec.engine.loading.group_quantizable", lambda *args: "PyTorch's kernels asked for")
    plain = specdec.load(method="none", quantize="int8", calibrate=False)
    compiled = specdec.load(method="none", quantize="int8", compile=True, calibrate=False)
    prompt = "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n"
    assert compiled.generate(prompt, max_new_tokens=32).token_ids == plain.generate(prompt, max_new_tokens=32).token_ids
    assert compiled.engine.target.model.compiled.one_compiled  # decode steps ran the 1-row graph
    assert compiled.engine.target.model.compiled.one_row_gemm is INT8_ONE_ROW_GEMM  # on the template alone


def test_autotuning_output_is_held_back_unless_compiling_fails(capsys):
    def autotune(fail: bool) -> int:
        sys.stderr.write("AUTOTUNE linear(1x576, 960x576)\n")
        if fail:
            raise RuntimeError("compile failed")
        return 7

    assert quietly(autotune, False) == 7
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError, match="compile failed"):
        quietly(autotune, True)
    assert "AUTOTUNE linear" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (dict(exact=True), "exact"),
    (dict(backend="transformers"), "native runtime"),
])
def test_compile_refuses_what_it_cannot_honour(options, message):
    with pytest.raises(SpecdecError, match=message):
        specdec.load(compile=True, calibrate=False, **options)


def test_serve_refuses_compile_with_batching(capsys):
    from specdec.cli.main import main

    assert main(["serve", "--compile", "--max-batch", "4"]) == 2
    assert "--compile" in capsys.readouterr().err
