"""`specdec verify` (specdec/cli/lossless_check.py) passes lossless methods and catches lossy ones,
both in its sampled (chi-square) and greedy (token-for-token) modes."""
import json

import specdec.engine.verdicts
from specdec.cli.main import main
from specdec.spec.verify import ChainVerdict

from helpers import make_model_dir


def run_verify(tmp_path, capsys, draft_seed: int, draft_scale: float) -> tuple[int, dict]:
    kw = dict(vocab_size=6, tokenizer="char", hidden_size=16, layers=1, heads=2, kv_heads=1, max_pos=32)
    target = make_model_dir(tmp_path / "t", seed=1, scale=3.0, **kw)
    draft = make_model_dir(tmp_path / "d", seed=draft_seed, scale=draft_scale, **kw)
    code = main(["verify", "--target", str(target), "--draft", str(draft), "--method", "draft",
                 "--prompt", "abcab", "--samples", "1500", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_verify_command_passes_a_lossless_method(tmp_path, capsys):
    code, report = run_verify(tmp_path, capsys, draft_seed=1, draft_scale=2.0)
    assert code == 0 and report["p_value"] > 0.001 and "consistent" in report["verdict"]
    assert report["drafted_tokens"] > 0 and report["accepted_tokens"] > 0


def test_verify_command_catches_a_lossy_verifier(tmp_path, capsys, monkeypatch):
    def lossy(drafts, draft_probs, target_probs, rng):  # accepts every draft
        return ChainVerdict(len(drafts), rng.categorical(target_probs[len(drafts)]))

    monkeypatch.setattr(specdec.engine.verdicts, "verify_rejection", lossy)
    code, report = run_verify(tmp_path, capsys, draft_seed=5, draft_scale=3.0)
    assert code == 1 and report["p_value"] < 0.001 and "DIFFERENT" in report["verdict"]


def test_verify_says_when_nothing_was_drafted(tmp_path, capsys):
    target = make_model_dir(tmp_path / "t", vocab_size=6, tokenizer="char", hidden_size=16, layers=1, heads=2,
                            kv_heads=1, max_pos=32)
    # no token of the prompt repeats, and one new token leaves no room for a second step
    code = main(["verify", "--target", str(target), "--method", "ngram", "--prompt", "abcde", "--tokens", "1",
                 "--samples", "50", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["drafted_tokens"] == 0 and "INCONCLUSIVE" in report["verdict"]


def identity_verify(tmp_path, capsys, *options: str) -> tuple[int, dict]:
    """`specdec verify` in its token-for-token mode (3 prompts x 16 tokens) on a tiny pair."""
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048, seed=1)
    draft = make_model_dir(tmp_path / "d", layers=1, max_pos=2048, seed=2)
    code = main(["verify", "--target", str(target), "--draft", str(draft), "--method", "draft",
                 "--samples", "3", "--tokens", "16", "--json", *options])
    return code, json.loads(capsys.readouterr().out)


def greedy_verify(tmp_path, capsys) -> tuple[int, dict]:
    return identity_verify(tmp_path, capsys, "--temperature", "0", "--dtype", "float64")


def test_greedy_verify_compares_prompts_token_for_token(tmp_path, capsys):
    code, report = greedy_verify(tmp_path, capsys)
    assert code == 0 and report["test"] == "greedy identity"
    assert report["prompts"] == 3 and report["identical"] == 3 and report["diverged"] == []


def test_greedy_verify_catches_a_verifier_that_keeps_wrong_drafts(tmp_path, capsys, monkeypatch):
    def lossy(drafts, target_probs):  # accepts every draft
        return ChainVerdict(len(drafts), int(target_probs[len(drafts)].argmax()))

    monkeypatch.setattr(specdec.engine.verdicts, "verify_greedy", lossy)
    code, report = greedy_verify(tmp_path, capsys)
    assert code == 1 and "DIFFERENT" in report["verdict"] and report["identical"] < 3


def test_verify_needs_a_speculative_method(tmp_path, capsys):
    code = None
    try:
        main(["verify", "--method", "none"])
    except SystemExit as e:
        code = e.code
    assert code == 2 and "--method" in capsys.readouterr().err


def seeded_verify(tmp_path, capsys) -> tuple[int, dict]:
    return identity_verify(tmp_path, capsys, "--temperature", "0.8", "--seed-mode", "invariant")


def test_seeded_verify_compares_seeded_outputs_token_for_token(tmp_path, capsys):
    code, report = seeded_verify(tmp_path, capsys)
    assert code == 0 and report["test"] == "seeded identity" and report["identical"] == 3


def test_seeded_verify_catches_a_verifier_that_keeps_wrong_drafts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(specdec.engine.verdicts, "verify_choices",
                        lambda drafts, choices: ChainVerdict(len(drafts), choices[len(drafts)]))
    code, report = seeded_verify(tmp_path, capsys)
    assert code == 1 and report["identical"] < 3 and "DIFFERENT seeded output" in report["verdict"]
