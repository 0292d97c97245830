"""DecoderConfig: the one description of a decoder (specdec.load's keywords, the command line,
`serve --ray`'s replicas); each bad field is a clear error before anything loads."""
import pickle

import pytest

import specdec
from specdec import DecoderConfig, SpecdecError
from specdec.cli.common import decoder_config
from specdec.cli.main import build_parser


@pytest.mark.parametrize("fields, message", [
    (dict(method="beam"), "unknown method 'beam'"),
    (dict(cross_vocab="x"), "unknown cross_vocab 'x'"),
    (dict(dtype="int3"), "int3"),
    (dict(compile=True, exact=True), "--compile runs the fastest kernels"),
    (dict(draft_tokens=0), r"draft_tokens must be an integer in \[1, 64\], got 0"),
    (dict(tree_nodes=True), "tree_nodes must be an integer"),
    (dict(typical_acceptance=True, method="ngram"), "typical acceptance applies to the tree methods"),
])
def test_each_bad_field_is_a_clear_error_before_loading(fields, message):
    with pytest.raises(SpecdecError, match=message):
        specdec.load(target="/nonexistent/model", **fields)  # checked before the target is opened


def test_an_unknown_option_is_named_with_the_known_ones():
    with pytest.raises(SpecdecError, match=r"unknown option\(s\) 'metod'; the options are .*method"):
        specdec.load(metod="draft")


def test_the_command_line_and_load_describe_the_same_decoder():
    args = build_parser().parse_args(["generate", "x", "--method", "draft", "--dtype", "bfloat16", "--draft-tokens",
                                      "3", "--no-memory", "--draft-vocab", "32768"])
    config = decoder_config(args, max_len=512)
    assert config == DecoderConfig(method="draft", dtype="bfloat16", draft_tokens=3, memory=False,
                                   draft_vocab=32768, max_len=512)
    assert pickle.loads(pickle.dumps(config)) == config  # what serve --ray sends to its replicas
    args = build_parser().parse_args(["generate", "x", "--method", "eagle", "--no-tree-lookup"])
    assert decoder_config(args) == DecoderConfig(method="eagle", tree_lookup=False)
    decoder = specdec.load_config(DecoderConfig(method="ngram", memory=False, calibrate=False))
    assert decoder.method == "ngram" and decoder.generate("def f(x):", max_new_tokens=4).stats.new_tokens == 4


def test_the_bundled_coders_draft_cuts_its_head_unless_told_otherwise():
    from specdec.models.bundled import default_draft_vocab

    assert default_draft_vocab("qwen-coder-draft") == 65536 and default_draft_vocab("QWEN-CODER-DRAFT") == 65536
    assert default_draft_vocab("qwen-coder") == 0 and default_draft_vocab(None) == 0
    assert default_draft_vocab("/no/such/draft") == 0
    args = build_parser().parse_args(["generate", "x", "--method", "draft"])
    assert decoder_config(args).draft_vocab is None  # the draft's own default
    args = build_parser().parse_args(["generate", "x", "--method", "draft", "--draft-vocab", "0"])
    assert decoder_config(args).draft_vocab == 0  # the whole head
