import json

import specdec
from specdec.bench import SpecdecRunner
from specdec.cli import main

from helpers import make_model_dir


def test_bench_runs_all_methods_side_by_side(tmp_path, capsys):
    target = make_model_dir(tmp_path / "t", layers=2, max_pos=2048)
    draft = make_model_dir(tmp_path / "d", layers=1, max_pos=2048, seed=1)
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["bench", "--target", str(target), "--draft", str(draft),
                 "--methods", "none,draft,ngram,draft:2,hf,hf-assisted,hf-lookup", "--temperatures", "0,1.0",
                 "--tasks", "code,edit", "--prompts", "1", "--max-new-tokens", "8", "--json", str(out),
                 "--plot", str(png)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 7 * 2 * 2
    for r in rows:
        assert r["new_tokens"] == 8 and r["tokens_per_second"] > 0 and r["model_memory_mb"] > 0
        if r["method"] == "none":
            assert r["speedup"] == 1.0
        if r["method"] in ("draft", "ngram", "draft:2"):
            assert r["acceptance_rate"] is not None and 0.0 <= r["acceptance_rate"] <= 1.0
            # tokens per pass = 1 + drafts kept per pass (fewer where max_new_tokens cut the last step)
            kept_per_pass = r["acceptance_rate"] * r["mean_draft_tokens"]
            assert 1.0 <= r["mean_accepted_length"] <= 1 + kept_per_pass + 0.01
    by_method = {r["method"]: r for r in rows if r["task"] == "code" and r["temperature"] == 0}
    assert by_method["draft:2"]["mean_draft_tokens"] <= 2.0  # NAME:K fixes K
    assert by_method["draft"]["model_memory_mb"] > by_method["none"]["model_memory_mb"]  # the draft counts
    assert by_method["hf-assisted"]["model_memory_mb"] > by_method["hf"]["model_memory_mb"]
    assert png.stat().st_size > 1000
    assert "speedup" in capsys.readouterr().out


def test_bench_runs_past_eos(tmp_path):
    """Every method does the same work: a run makes max_new tokens even where EOS comes first."""
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    decoder = specdec.load(target=target)
    prompt = "def add(a, b):"
    first = decoder.generate(prompt, max_new_tokens=1).token_ids[0]
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": first}))
    decoder = specdec.load(target=target)
    assert len(decoder.generate(prompt, max_new_tokens=8).token_ids) < 8  # EOS ends plain generation
    assert SpecdecRunner(decoder).run(prompt, 0.0, 8, seed=0).new_tokens == 8


def test_bench_rejects_unknown_method(tmp_path, capsys):
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    assert main(["bench", "--target", str(target), "--methods", "none,warp"]) == 2
    assert "unknown bench method" in capsys.readouterr().err
