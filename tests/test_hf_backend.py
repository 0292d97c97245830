"""Models outside the native families run through transformers with the same interface."""
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import specdec
from specdec.errors import SpecdecError
from specdec.train.tokenizer import save_tokenizer, train_tokenizer

from helpers import SAMPLE_TEXT


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    tok = train_tokenizer(SAMPLE_TEXT, vocab_size=300)
    save_tokenizer(tok, path)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(str(path), safe_serialization=True)
    return path


def test_plain_greedy_matches_generate(gpt2_dir):
    decoder = specdec.load(target=gpt2_dir, dtype="float64")
    hf = GPT2LMHeadModel.from_pretrained(str(gpt2_dir), dtype=torch.float64).eval()
    ids = decoder.tokenizer.encode("def add(a, b):")
    want = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20, eos_token_id=None,
                       pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):]
    assert decoder.generate(ids, max_new_tokens=20, ignore_eos=True).token_ids == want.tolist()


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_chain_methods_are_lossless(gpt2_dir, method):
    plain = specdec.load(target=gpt2_dir, dtype="float64")
    # a fixed draft length: whether drafting pays here is the controller's business (a self-draft
    # costs what the target does, so it may rightly stay plain for a whole prompt)
    spec = specdec.load(target=gpt2_dir, draft=gpt2_dir if method == "draft" else None, method=method,
                        dtype="float64", draft_tokens=4)
    for prompt in ("def add(a, b):", "for i in range(10):\n"):
        want = plain.generate(prompt, max_new_tokens=24)
        got = spec.generate(prompt, max_new_tokens=24)
        assert got.token_ids == want.token_ids
    if method == "draft":  # self-draft: everything is accepted
        assert got.stats.acceptance_rate == 1.0


def test_tree_methods_need_native_runtime(gpt2_dir):
    with pytest.raises(SpecdecError, match="native"):
        specdec.load(target=gpt2_dir, draft=gpt2_dir, method="medusa")
