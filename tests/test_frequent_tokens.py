"""A draft model's output head cut to its most frequent tokens (frequent_tokens.py, models/subset_head.py)."""
from collections import Counter
from pathlib import Path

import pytest
import torch

import specdec
import specdec.data.frequent_tokens as draft_vocab
from specdec.engine.loading import load_runner
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.models.subset_head import SubsetHead, restrict_head


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from test_gguf import write_from

    from helpers import make_model_dir

    folder = make_model_dir(tmp_path_factory.mktemp("tiny"), hidden_size=64, heads=4, kv_heads=2, seed=3,
                            special_tokens=("<|fim_prefix|>",))
    return write_from(folder, tmp_path_factory.mktemp("gguf") / "tiny-q8_0.gguf", "q8_0")


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A two-file corpus in place of the standard library, and a fresh cache."""
    root = tmp_path / "lib"
    root.mkdir()
    (root / "a.py").write_text("return return return self self\n" * 50)
    (root / "b.py").write_text("import os\n" * 20)
    (root / "c.py").write_text("class Config:\n    pass\n")
    monkeypatch.setattr(draft_vocab, "stdlib_root", lambda: root)
    monkeypatch.setenv("SPECDEC_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(draft_vocab, "CORPUS_EVERY", 1)
    return root


def test_the_cut_head_gives_the_full_heads_logits_on_its_tokens_and_minus_inf_elsewhere(tiny_gguf):
    runner = load_runner(str(tiny_gguf), "bfloat16", quantize="gguf")
    ids = [5, 17, 40, 3]
    full = runner.extend(ids).float()
    keep = torch.tensor([0, 3, 9, 40, 41, 200, 7])
    assert restrict_head(runner.model, keep) == 7
    runner.reset()
    cut = runner.extend(ids).float()
    kept = keep.sort().values
    assert torch.equal(cut[:, kept], full[:, kept])
    others = torch.ones(full.shape[1], dtype=torch.bool)
    others[kept] = False
    assert bool(torch.isneginf(cut[:, others]).all())


def test_tokens_are_ranked_special_first_then_by_corpus_frequency_and_cached(tiny_gguf, corpus, monkeypatch):
    tok = TextTokenizer(tiny_gguf).tok
    vocab = tok.get_vocab_size()
    ranked = draft_vocab.ranked_tokens(tok, vocab)
    assert sorted(ranked) == list(range(vocab))  # every id, once
    added = sorted(i for i in tok.get_added_tokens_decoder() if i < vocab)
    assert ranked[:len(added)] == added
    counts = Counter()
    for path in draft_vocab.split_files(corpus)[0]:  # the training files
        counts.update(i for i in tok.encode(path.read_text(), add_special_tokens=False).ids if i not in added)
    (frequent, _), *_, (rare, _) = counts.most_common()
    assert counts[frequent] > counts[rare] > 0
    never = max(i for i in range(vocab) if i not in added and i not in counts)
    assert ranked.index(frequent) < ranked.index(rare) < ranked.index(never)
    assert ranked[len(added):len(added) + len(counts)] == sorted(counts, key=lambda i: (-counts[i], i))
    monkeypatch.setattr(draft_vocab, "token_counts", lambda *a: pytest.fail("counted again"))
    assert draft_vocab.ranked_tokens(tok, vocab) == ranked  # from the cache file
    assert draft_vocab.frequent_tokens(tok, vocab, 10).tolist() == ranked[:10]


def test_greedy_speculation_with_a_cut_draft_head_is_identical_to_plain(tiny_gguf, corpus):
    plain = specdec.load(target=str(tiny_gguf), quantize="gguf", dtype="bfloat16")
    spec = specdec.load(target=str(tiny_gguf), quantize="gguf", dtype="bfloat16", method="draft",
                        draft=str(tiny_gguf), draft_tokens=4, draft_vocab=60)
    head = spec.engine.proposer.runner.model.lm_head
    assert isinstance(head, SubsetHead) and head.keep.numel() == 60
    proposed = 0
    for prompt in ["def add(a, b):\n    return", "import os\nimport sys\n\nclass Config:"]:
        want = plain.generate(prompt, max_new_tokens=24, temperature=0).token_ids
        got = spec.generate(prompt, max_new_tokens=24, temperature=0)
        assert got.token_ids == want
        proposed += got.stats.drafted_tokens
    assert proposed > 0


def test_a_bad_draft_vocab_is_refused_by_name(tiny_gguf, corpus):
    for bad in (-1, 2.5, True):
        with pytest.raises(SpecdecError, match="draft_vocab"):
            specdec.load(target=str(tiny_gguf), quantize="gguf", dtype="bfloat16", method="draft",
                         draft=str(tiny_gguf), draft_vocab=bad)
