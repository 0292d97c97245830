import json

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
            assert r["mean_accepted_length"] >= 1.0 and r["acceptance_rate"] is not None
    draft_mem = next(r["model_memory_mb"] for r in rows if r["method"] == "draft")
    none_mem = next(r["model_memory_mb"] for r in rows if r["method"] == "none")
    assert draft_mem > none_mem  # the draft model's memory is counted
    assert png.stat().st_size > 1000
    assert "speedup" in capsys.readouterr().out


def test_bench_rejects_unknown_method(tmp_path, capsys):
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    assert main(["bench", "--target", str(target), "--methods", "none,warp"]) == 2
    assert "unknown bench method" in capsys.readouterr().err
