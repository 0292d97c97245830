"""The training recipe's code path on a tiny corpus, in seconds: tokenizer, target, resume,
distilled draft, Medusa heads and EAGLE head, each loadable and usable for decoding."""
import json
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.cli.main import main
from specdec.errors import SpecdecError
from specdec.models import LlamaModel, ModelConfig
from specdec.models.checkpoint import load_native

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in ("abc.py", "bisect.py", "colorsys.py", "keyword.py", "this.py"):
        shutil.copy(STDLIB / name, corpus / name)
    common = ["--corpus", str(corpus), "--batch-size", "2", "--seq-len", "32"]
    assert main(["train", "lm", "--preset", "tiny", "--out", str(root / "target"), "--vocab-size", "300",
                 "--steps", "6", "--checkpoint-every", "3", *common]) == 0
    assert main(["train", "lm", "--preset", "tiny", "--out", str(root / "draft"), "--steps", "4",
                 "--tokenizer", str(root / "target" / "tokenizer"), "--teacher", str(root / "target" / "model"),
                 *common]) == 0
    assert main(["train", "medusa", "--target", str(root / "target" / "model"), "--out", str(root / "medusa"),
                 "--steps", "3", "--num-heads", "2", "--tree-nodes", "5", *common]) == 0
    assert main(["train", "eagle", "--target", str(root / "target" / "model"), "--out", str(root / "eagle"),
                 "--steps", "3", *common]) == 0
    return root


def test_models_load_in_transformers_and_match(run_dir):
    for name in ("target", "draft"):
        folder = run_dir / name / "model"
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(folder))
        ids = tok("def f(x):\n    return x", return_tensors="pt").input_ids
        native = load_native(folder, "float32")
        with torch.no_grad():
            assert torch.allclose(native(ids), hf(ids).logits, atol=1e-4)
        card = json.loads((folder / "training.json").read_text())
        assert card["heldout_loss_nats_per_token"] > 0


def test_resume_continues_from_checkpoint(run_dir, capsys):
    state = json.loads((run_dir / "target" / "run" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6
    # asking for more steps resumes at 6 instead of starting over
    assert main(["train", "lm", "--preset", "tiny", "--out", str(run_dir / "target"), "--steps", "8",
                 "--corpus", str(run_dir / "corpus"), "--batch-size", "2", "--seq-len", "32"]) == 0
    assert "resumed" in capsys.readouterr().out
    assert json.loads((run_dir / "target" / "run" / "checkpoint" / "state.json").read_text())["step"] == 8


def test_heads_decode_losslessly(run_dir):
    target = run_dir / "target" / "model"
    plain = specdec.load(target=target, dtype="float64").generate("def", max_new_tokens=12).token_ids
    for method in ("medusa", "eagle"):
        spec = specdec.load(target=target, draft=run_dir / method, method=method, dtype="float64")
        assert spec.generate("def", max_new_tokens=12).token_ids == plain
    cfg = json.loads((run_dir / "medusa" / "config.json").read_text())
    assert len(cfg["tree"]) == 5 and len(cfg["heldout_top1"]) == 2


def test_medusa_tree_rebuild(run_dir):
    assert main(["train", "medusa-tree", "--heads", str(run_dir / "medusa"), "--nodes", "3"]) == 0
    assert len(json.loads((run_dir / "medusa" / "config.json").read_text())["tree"]) == 3


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_head_training_continues_from_init(run_dir, tmp_path, method):
    """--init starts from an existing head (to re-fit heads after the target changed): with a
    zero learning rate the weights come out exactly as they went in."""
    from safetensors.torch import load_file

    out = tmp_path / method
    assert main(["train", method, "--target", str(run_dir / "target" / "model"), "--out", str(out),
                 "--init", str(run_dir / method), "--steps", "1", "--lr", "0",
                 "--corpus", str(run_dir / "corpus"), "--batch-size", "2", "--seq-len", "32"]) == 0
    before, after = load_file(str(run_dir / method / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads((out / "config.json").read_text())["init"] == str(run_dir / method)


TINY = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)


def test_interrupted_run_resumes_exactly(tmp_path, monkeypatch):
    """A run killed after its step-3 checkpoint and started again ends with the same weights,
    bit for bit, as a run never interrupted: weights, AdamW moments and the batch sampler's RNG
    all come back from the checkpoint."""
    from specdec.train import lm
    from specdec.train.lm import TrainConfig, train_lm

    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, 400).astype(np.uint16)
    cfg = TrainConfig(steps=6, batch_size=2, seq_len=16, warmup=2, checkpoint_every=3)
    full, _ = train_lm(TINY, tokens, tmp_path / "full", cfg, log=lambda line: None)

    real_loss, calls = lm.lm_loss, []

    def crash_at_step_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(lm, "lm_loss", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_lm(TINY, tokens, tmp_path / "cut", cfg, log=lambda line: None)
    monkeypatch.setattr(lm, "lm_loss", real_loss)
    lines: list[str] = []
    resumed, _ = train_lm(TINY, tokens, tmp_path / "cut", cfg, log=lines.append)
    assert lines[0].endswith("at step 3")
    want, got = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_too_little_training_data_is_a_clear_error():
    from specdec.train.loop import LoopSettings, OptimConfig, train_loop

    model = torch.nn.Linear(2, 2)
    with pytest.raises(SpecdecError, match="too few for sequences of 32"):
        train_loop(model, lambda batch: model.weight.sum(), np.zeros(20, np.uint16),
                   OptimConfig(steps=1, seq_len=32), LoopSettings("x"), log=lambda line: None)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_head_folder_that_does_not_fit_its_weights(run_dir, tmp_path, method):
    from specdec.spec.proposers.eagle_head import load_eagle
    from specdec.spec.proposers.medusa import load_medusa

    load = load_medusa if method == "medusa" else load_eagle
    folder = tmp_path / method
    shutil.copytree(run_dir / method, folder)
    cfg = json.loads((folder / "config.json").read_text())
    if method == "medusa":
        cfg["num_heads"] += 1
    else:
        cfg["head_config"]["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecdecError, match="do not fit its config.json"):
        load(folder)
    del cfg["num_heads" if method == "medusa" else "head_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecdecError, match="lacks or mangles a field"):
        load(folder)


def test_draft_fine_tuned_on_a_targets_answers_in_its_own_tokenizer(run_dir, tmp_path, capsys):
    """`train answers` output (the target's ids) re-encoded with another tokenizer: the draft
    trains on the same text, and `--init` trains on from the given model, not from scratch."""
    from specdec.engine.text import TextTokenizer
    from specdec.models.bundled import BUNDLED_DIR
    from specdec.train.self_distill import generations_tokens

    target_dir, draft_dir = run_dir / "target" / "model", BUNDLED_DIR / "pycode-draft"
    target_tok, draft_tok = TextTokenizer(target_dir).tok, TextTokenizer(draft_dir).tok
    texts = [f"def f{i}(x):\n    return x * {i} + len('é{i}')\n" for i in range(40)]
    with (tmp_path / "generations.jsonl").open("w") as f:
        for text in texts:
            ids = target_tok.encode(text, add_special_tokens=False).ids
            row = {"kind": "code", "temperature": 0.0, "prompt_ids": ids[:5], "output_ids": ids[5:]}
            f.write(json.dumps(row) + "\n")
    eos = load_native(draft_dir).config.eos_token_id
    train_ids, held_ids = generations_tokens(tmp_path / "generations.jsonl", target_tok, draft_tok, eos)
    kept = "".join(text for i, text in enumerate(texts) if i % 20 != 19)
    assert draft_tok.decode([int(t) for t in train_ids if t != eos]) == kept
    assert draft_tok.decode([int(t) for t in held_ids if t != eos]) == texts[19] + texts[39]

    out = tmp_path / "xdraft"
    assert main(["train", "lm", "--init", str(draft_dir), "--generations", str(tmp_path / "generations.jsonl"),
                 "--target", str(target_dir), "--out", str(out), "--steps", "2", "--batch-size", "2",
                 "--seq-len", "32", "--lr", "1e-4"]) == 0
    card = json.loads((out / "model" / "training.json").read_text())
    assert card["init"] == str(draft_dir) and card["parameters"] == 2360256
    assert (out / "model" / "tokenizer.json").read_text() == (draft_dir / "tokenizer.json").read_text()
    # two small steps from the bundled draft: its loss on this code, not a random model's ~ln(8192) = 9
    assert card["heldout_loss_nats_per_token"] < 6.0
    assert main(["train", "lm", "--init", str(draft_dir), "--generations", str(tmp_path / "generations.jsonl"),
                 "--out", str(tmp_path / "x2"), "--steps", "1"]) != 0
    assert "--generations needs --target" in capsys.readouterr().err


def test_grown_model_computes_what_it_grew_from_then_trains_all_layers():
    from specdec.train.lm import grow_layers

    torch.manual_seed(0)
    small = LlamaModel(TINY)
    grown = grow_layers(small, 3)
    assert grown.config.num_hidden_layers == 3
    ids = torch.randint(0, TINY.vocab_size, (2, 12))
    assert torch.equal(small(ids), grown(ids))
    grown(ids).logsumexp(-1).sum().backward()  # the zeroed projections get gradients: the new layers can learn
    assert grown.model.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0
    with pytest.raises(SpecdecError, match="cannot grow a 3-layer model to 2"):
        grow_layers(grown, 2)
