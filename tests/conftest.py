import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
# Tiny test models are dominated by per-op overhead: one thread avoids oversubscription.
torch.set_num_threads(1)
# Controllers must not learn from earlier test runs (or the developer's own runs) through the
# cache file: tests that exercise controller memory name their own file.
os.environ["SPECDEC_CONTROLLER_MEMORY"] = "off"


import pytest  # noqa: E402


@pytest.fixture(params=["kernel", "rows alone"])
def kernels(request, monkeypatch):
    """Exact mode on the batch-invariant kernels (kernels/rows.cpp), and without them (each row
    computed alone by PyTorch, as where they cannot be built)."""
    from specdec.kernels import build, invariant

    if request.param == "kernel":
        if build.load() is None:
            pytest.skip(f"the invariant kernels are unavailable here: {build.unavailable()}")
    else:
        monkeypatch.setattr(invariant, "load", lambda: None)
    return request.param


# The default tier must finish within 5 minutes on a 2-core machine (README): these long tests run
# in the slow tier (`-m slow`). Each property they check keeps a faster check in the default tier:
# the sibling named in the comment.
SLOW_TIER = {
    "test_gguf.py::test_smollm2_eagle_head_is_shipped_and_lossless",  # ...draft_model_is_shipped_and_lossless
    "test_gguf.py::test_smollm2_tokenizer_matches_transformers_gguf_tokenizer",  # ..._matches_the_folder_tokenizer
    "test_bench.py::test_compiled_pass_costs_time_the_compiled_passes_too",  # test_compiled.py
    "test_row_attention.py::test_compiled_bf16_passes_call_the_kernel_inside_their_graph",  # eager kernel test
    "test_tree_methods.py::test_a_tree_verifier_told_the_wrong_draft_distribution_fails",  # test_tree_verify's
    "test_tree_methods.py::test_tree_sampling_matches_target_distribution[eagle-{'temperature': 1.0}]",  # [medusa-...]
    "test_bundled.py::test_greedy_identity_float64[draft]",  # bfloat16 exact mode [draft]
    "test_bundled.py::test_greedy_identity_float64[medusa]",  # bfloat16 exact mode [medusa]
    "test_bundled.py::test_greedy_identity_float64[eagle]",  # bfloat16 exact mode [eagle]
    "test_bundled.py::test_greedy_identity_float64[ngram]",  # bfloat16 exact mode [ngram]
    "test_lossless_check.py::test_verify_command_passes_a_lossless_method",  # ...catches_a_lossy_verifier
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int4-ngram]",  # [int8-ngram]
    "test_batch.py::test_batched_sampling_keeps_each_temperature_distribution[draft]",  # [ngram]
    "test_batch.py::test_batched_sampling_keeps_each_temperature_distribution[none]",  # [ngram]
    "test_batch.py::test_a_wrong_verifier_fails_the_batched_test",  # test_end_to_end_stats' wrong verifier
    "test_cross_vocab.py::test_penalised_sampling_drafts_without_the_penalties",  # test_sampling_matches_the_target
    "test_cross_vocab.py::test_sampling_matches_the_target[0.7]",  # [1.0]
    "test_cross_vocab.py::test_not_renormalising_fails_the_same_test",  # the exact cross-vocab enumeration tests
    "test_grammar.py::test_constrained_sampling_matches_the_constrained_target[draft]",  # [ngram]
    "test_grammar.py::test_constrained_sampling_matches_the_constrained_target[medusa]",  # [ngram]
    "test_seeded.py::test_every_method_gives_plain_seeded_output_in_bfloat16[draft]",  # [ngram]
    "test_seeded.py::test_every_method_gives_plain_seeded_output_in_bfloat16[eagle]",  # [ngram]
    "test_seeded.py::test_every_method_gives_plain_seeded_output_in_bfloat16[medusa]",  # [ngram]
    "test_seeded.py::test_noise_shared_across_positions_fails_the_same_test",  # seeded draft sampling's test
    "test_end_to_end_stats.py::test_counts_that_ignore_the_drafts_fail_the_same_test",  # a_wrong_verifier_fails
    "test_end_to_end_stats.py::test_penalized_tree_sampling_matches_target",  # test_penalties' enumeration
    "test_end_to_end_stats.py::test_penalized_draft_sampling_matches_target",  # test_penalties' enumeration
    "test_end_to_end_stats.py::test_ngram_sampling_matches_target",  # draft_sampling_matches_target_with_many_...
    "test_tree_verify.py::test_sampled_tree_is_exact[True-1]",  # [True-0], [False-2]
    "test_tree_verify.py::test_sampled_tree_is_exact[True-2]",  # [True-0], [False-2]
    "test_tree_verify.py::test_sampled_tree_is_exact[True-3]",  # [True-0], [False-2]
    "test_tree_verify.py::test_penalized_sampled_tree_is_exact[1-True]",  # [0-False]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int8-draft]",  # [int8-ngram]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int8-medusa]",  # [int8-ngram]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int8-eagle]",  # [int8-ngram]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int4-draft]",  # [int4-ngram]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int4-medusa]",  # [int4-ngram]
    "test_quant.py::test_every_method_is_lossless_for_the_quantized_target[int4-eagle]",  # [int4-ngram]
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items):
    found = set()
    for item in items:
        name = item.nodeid.split("/")[-1]
        if name in SLOW_TIER:
            item.add_marker(pytest.mark.slow)
            found.add(name)
    if len(items) > 500 and found != SLOW_TIER:  # a whole-suite run: every name must still exist
        raise pytest.UsageError(f"tests/conftest.py SLOW_TIER names missing tests: {sorted(SLOW_TIER - found)}")
