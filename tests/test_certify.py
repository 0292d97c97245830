import json

import specdec
import specdec.engine
from specdec.cli import main
from specdec.verify import ChainVerdict

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

    monkeypatch.setattr(specdec.engine, "verify_rejection", lossy)
    code, report = run_verify(tmp_path, capsys, draft_seed=5, draft_scale=3.0)
    assert code == 1 and report["p_value"] < 0.001 and "DIFFERENT" in report["verdict"]
