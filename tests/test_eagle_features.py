"""EAGLE heads trained on stored target features with a reduced draft vocabulary: the stored
features are the target's own, training windows stay inside sequences, the draft vocabulary
is the most frequent tokens, and a head with its own small output projection drafts
losslessly through the engine (greedy and seeded output identical to plain decoding)."""
from dataclasses import replace

import pytest
import torch

import specdec
from specdec.models.bundled import DEFAULT_TARGET
from specdec.models.checkpoint import load_native
from specdec.spec.proposers.draft_vocab import coverage, expand_logits, frequent_tokens
from specdec.spec.proposers.eagle import TreeShape
from specdec.spec.proposers.eagle_head import EagleHead, load_eagle, save_eagle
from specdec.train.features import FeatureSet, Windows, extract_features
from specdec.train.heads import HeadTrainConfig, eagle_feature_accuracy, train_eagle_features
from specdec.train.loop import LoopSettings


@pytest.fixture(scope="module")
def target():
    return load_native(DEFAULT_TARGET, "float32")


@pytest.fixture(scope="module")
def data(target) -> FeatureSet:
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (70, 20, 45)]
    return extract_features(target, seqs, log_every=0)


def test_stored_features_are_the_targets(target, data, tmp_path):
    assert data.starts.tolist() == [0, 70, 90, 135] and data.features.shape == (135, target.config.hidden_size)
    seq = data.tokens[70:90]
    with torch.inference_mode():
        logits, hidden = target(seq[None], return_hidden=True)
    torch.testing.assert_close(data.features[70:90], hidden[0])
    torch.testing.assert_close(data.lse[70:90], logits[0].logsumexp(-1))
    data.save(tmp_path)
    again = FeatureSet.load(tmp_path)
    assert torch.equal(again.features, data.features) and torch.equal(again.starts, data.starts)


def test_windows_never_span_two_sequences(data):
    w = Windows.cut(data, seq_len=16, min_len=4)
    starts = data.starts.tolist()
    for b, n in zip(w.begin.tolist(), w.length.tolist()):
        s = max(i for i, a in enumerate(starts) if a <= b)
        assert b + n <= starts[s + 1]
    tokens, feats, _, valid = w.batch(data, torch.tensor([0, len(w.begin) - 1]))
    assert valid[0].all() and tokens.shape == valid.shape and feats.shape[:2] == valid.shape
    assert valid[1].sum() == w.length[-1]


def test_frequent_tokens_and_coverage():
    counts = torch.tensor([5, 0, 9, 1, 9, 3])
    d2t = frequent_tokens(counts, 3)
    assert d2t.tolist() == [0, 2, 4]  # the three most frequent, in id order
    assert coverage(counts, d2t) == pytest.approx(23 / 27)
    full = expand_logits(torch.tensor([[1.0, 2.0, 3.0]]), d2t, 6)
    assert full[0, 2] == 2.0 and torch.isinf(full[0, [1, 3, 5]]).all()


def trained_head(target, data, steps: int = 3) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead(replace(target.config, num_hidden_layers=1), draft_vocab=64)
    head.d2t.copy_(frequent_tokens(data.token_counts(target.config.vocab_size), 64))
    cfg = HeadTrainConfig(steps=steps, batch_size=2, seq_len=16, warmup=1, unroll=2)
    train_eagle_features(head, target.model.embed_tokens, target.lm_head.weight.detach(), data, cfg,
                         LoopSettings("eagle"), log=lambda *_: None)
    return head


def test_training_moves_the_head_and_reports_accuracy(target, data):
    torch.manual_seed(0)
    before = EagleHead(replace(target.config, num_hidden_layers=1), draft_vocab=64).fc.weight.clone()
    head = trained_head(target, data)
    assert not torch.equal(head.fc.weight, before)
    acc = eagle_feature_accuracy(head, target.model.embed_tokens, target.lm_head.weight.detach(), data,
                                 depth=2, seq_len=16)
    assert len(acc["top1_by_depth"]) == 2 and all(0 <= a <= 1 for a in acc["top1_by_depth"])
    assert 0 < acc["argmax_coverage"] <= 1


def test_reduced_vocabulary_head_is_lossless(target, data, tmp_path):
    head = trained_head(target, data, steps=2)
    save_eagle(head, tmp_path / "head", {"target_vocab_size": target.config.vocab_size,
                                         "tree": TreeShape(top_k=3, depth=3, expand=3, nodes=8).__dict__})
    loaded, meta = load_eagle(tmp_path / "head")
    assert meta["draft_vocab_size"] == 64 and torch.equal(loaded.d2t, head.d2t)
    plain = specdec.load(calibrate=False)
    eagle = specdec.load(method="eagle", draft=tmp_path / "head", calibrate=False)
    for prompt in ("def parse(self, text):\n", "import os\n\n\nclass "):
        want = plain.generate(prompt, max_new_tokens=24, temperature=0).token_ids
        assert eagle.generate(prompt, max_new_tokens=24, temperature=0).token_ids == want
        seeded = dict(max_new_tokens=24, temperature=1.0, seed=3)
        assert eagle.generate(prompt, **seeded).token_ids == plain.generate(prompt, **seeded).token_ids
    proposer, drafted = eagle.engine.proposer, []
    propose = proposer.propose
    proposer.propose = lambda *a, **k: drafted.append(propose(*a, **k)) or drafted[-1]
    eagle.generate("x = 1\n", max_new_tokens=16, temperature=0.8)
    assert drafted and all(set(p.tokens) <= set(head.d2t.tolist()) for p in drafted)
    assert all(p.draft_probs[:, ~torch.isin(torch.arange(len(p.draft_probs[0])), head.d2t)].sum() == 0
               for p in drafted if p.draft_probs is not None)


def test_head_training_resumes_from_its_checkpoint(target, data, tmp_path):
    """Checkpoints of a head hold its own state dict (its lm_head and d2t too): a finished run
    restarted on the same folder resumes at its last step with the same weights."""
    def run(seed: int) -> EagleHead:
        torch.manual_seed(seed)
        head = EagleHead(replace(target.config, num_hidden_layers=1), draft_vocab=32)
        head.d2t.copy_(frequent_tokens(data.token_counts(target.config.vocab_size), 32))
        cfg = HeadTrainConfig(steps=2, batch_size=2, seq_len=16, warmup=1)
        settings = LoopSettings("eagle", checkpoint_dir=tmp_path / "run", checkpoint_every=1)
        train_eagle_features(head, target.model.embed_tokens, target.lm_head.weight.detach(), data, cfg,
                             settings, log=logs.append)
        return head

    logs = []
    first = run(1)
    second = run(2)  # another initialisation: only the restore can make it equal
    assert any("resumed" in line and "step 2" in line for line in logs)
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)


def test_recipe_commands_end_to_end(tmp_path):
    """`train eagle-data` (self-distilled answers + stored features) then `train eagle
    --features` on a small corpus: a head folder the engine drafts with, losslessly."""
    import inspect
    import json

    from specdec.cli.main import main
    from specdec.data.prompts import function_snippets

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    source = inspect.getsource(function_snippets)  # a real function of 7+ lines per file
    for i in range(4):
        (corpus / f"m{i}.py").write_text(f"import os\n\n\n{source}\n\nVALUE_{i} = {i}\n")
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["train", "eagle-data", "--target", str(DEFAULT_TARGET), "--out", str(data), "--corpus",
                 str(corpus), "--prompts", "2", "--max-tokens", "8", "--dtype", "float32",
                 "--code-tokens", "400", "--heldout-tokens", "200", "--seq-len", "64"]) == 0
    rows = [json.loads(line) for line in (data / "generations.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["chat", "chat", "code", "code"] and all(r["output_ids"] for r in rows)
    assert FeatureSet.load(data / "train").num_sequences > len(rows)
    # `train answers` makes the same answers alone (for a draft model), and keeps them when run again
    answers = ["train", "answers", "--target", str(DEFAULT_TARGET), "--out", str(tmp_path / "answers"), "--corpus",
               str(corpus), "--prompts", "2", "--max-tokens", "8", "--dtype", "float32"]
    assert main(answers) == 0 and main(answers) == 0
    assert (tmp_path / "answers" / "generations.jsonl").read_text() == (data / "generations.jsonl").read_text()
    assert main(["train", "eagle", "--target", str(DEFAULT_TARGET), "--features", str(data), "--out", str(run),
                 "--steps", "2", "--draft-vocab", "64", "--batch-size", "2", "--seq-len", "32"]) == 0
    meta = json.loads((run / "model" / "config.json").read_text())
    assert meta["draft_vocab_size"] == 64 and "top1_by_depth" in meta["heldout_accuracy"]
    plain = specdec.load(calibrate=False)
    eagle = specdec.load(method="eagle", draft=run / "model", calibrate=False)
    want = plain.generate("def f(x):\n", max_new_tokens=16, temperature=0).token_ids
    assert eagle.generate("def f(x):\n", max_new_tokens=16, temperature=0).token_ids == want
