import json
from pathlib import Path

import pytest

import specdec
from specdec.bench.methods import SpecdecRunner
from specdec.cli.main import main
from specdec.errors import SpecdecError

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
            assert r["speedup"] == 1.0 and r["decode_speedup"] == 1.0
        if r["method"].startswith("hf"):  # transformers does not say how long its prefill took
            assert r["decode_tokens_per_second"] is None and r["decode_speedup"] is None
        else:  # after the prompt's prefill: faster than the whole run's rate
            assert r["decode_tokens_per_second"] > r["tokens_per_second"] and r["decode_speedup"] > 0
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
    assert "decode tok/s" in capsys.readouterr().out


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


def test_bench_fast_suffix_turns_exact_mode_off(tmp_path):
    from contextlib import ExitStack

    from specdec.bench.methods import make_runner
    from specdec.engine.text import TextTokenizer

    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    setup = dict(target=str(target), draft=None, dtype="bfloat16", heads={}, draft_tokens=None)
    with ExitStack() as stack:
        runners = {m: make_runner(m, setup, stack, TextTokenizer(target)) for m in ("ngram", "ngram@fast")}
    assert runners["ngram"].decoder.exact and not runners["ngram@fast"].decoder.exact
    with pytest.raises(SpecdecError, match="@fast"):
        make_runner("hf@fast", setup, ExitStack(), TextTokenizer(target))


def test_suite_keeps_raw_tasks_and_adds_instruction_tasks():
    from specdec.data.prompts import CHAT_TASKS, RAW_TASKS, build_suite, rename_target

    suite = build_suite(3)
    assert [p.task for p in suite] == [t for t in RAW_TASKS + CHAT_TASKS for _ in range(3)]
    assert [p.text for p in build_suite(3, RAW_TASKS)] == [p.text for p in suite[:9]]
    assert all(p.messages is None for p in suite[:9])
    for p in suite[9:]:
        assert p.messages == [{"role": "user", "content": p.text}] and "```python\ndef " in p.text
    for p in [p for p in suite if p.task == "rewrite"]:
        old = p.text.split("`")[1]
        assert old == rename_target(p.text.split("```python\n")[1].split("```")[0])
        assert p.text.count(old) >= 4  # the instruction names it, the code uses it at least 3 times
    assert [p.task for p in build_suite(2, ["rewrite", "code"])] == ["code", "code", "rewrite", "rewrite"]


def test_longcode_prompts_are_a_files_text_up_to_a_function_deep_in_it():
    from specdec.data.corpus import split_files, stdlib_root
    from specdec.data.prompts import LONG_CONTEXT, build_suite

    suite = build_suite(2, ["longcode", "code"])
    assert [p.task for p in suite] == ["code", "code", "longcode", "longcode"]
    files = {path.name: path.read_text(encoding="utf-8", errors="replace") for path in split_files(stdlib_root())[1]}
    for p in suite[2:]:
        source = files[p.name]
        at = source.index(p.text)  # whole lines of the held-out file, ending where a function's body starts
        assert LONG_CONTEXT - 200 < len(p.text) <= LONG_CONTEXT and source[at - 1] == "\n" and p.text.endswith("\n")
        assert "def " in p.text[-2000:] and at > 0


def test_rename_target_picks_the_most_used_parameter():
    from specdec.data.prompts import rename_target

    src = "def f(self, a, items, b):\n    for x in items:\n        a += x * items[0] + b\n    return a, items\n"
    assert rename_target(src) == "items"
    assert rename_target("def g(a):\n    return a\n") is None  # used twice only
    assert rename_target("    def h(self):\n") is None  # not parseable on its own


def test_chat_prompts_render_with_the_models_template():
    from specdec.chat.template import ChatTemplate
    from specdec.data.prompts import build_suite, render_chat

    chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    suite = build_suite(1, ["code", "chat"])
    rendered = render_chat(suite, ChatTemplate(chatml))
    assert rendered[0].text == suite[0].text  # raw-text task untouched
    assert rendered[1].text == f"<|im_start|>user\n{suite[1].text}<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(suite, ChatTemplate())[1].text == f"user: {suite[1].text}\nassistant: "


def test_defaults_follow_the_target(tmp_path):
    from specdec.bench.methods import default_methods, default_tasks
    from specdec.engine.text import TextTokenizer

    assert default_methods(None, None, None) == ["none", "draft", "ngram", "medusa", "eagle", "hf",
                                                  "hf-assisted", "hf-lookup"]
    target = make_model_dir(tmp_path / "t", layers=1)
    assert default_methods(str(target), None, Path("llama-server")) == ["none", "ngram", "hf", "hf-lookup",
                                                                         "llama.cpp", "llama.cpp-ngram"]
    assert "hf-assisted" in default_methods(str(target), "some-draft", None)
    assert {"eagle", "draft", "hf-assisted"} <= set(default_methods("smollm2", None, None))  # its drafters ship
    assert default_tasks(TextTokenizer(target)) == ["code", "edit", "freetext"]
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    assert default_tasks(TextTokenizer(target)) == ["code", "chat", "rewrite"]


def test_bench_chat_tasks_on_a_model_without_template(tmp_path):
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    out = tmp_path / "b.json"
    assert main(["bench", "--target", str(target), "--methods", "none,ngram", "--tasks", "chat,rewrite",
                 "--temperatures", "0", "--prompts", "1", "--max-new-tokens", "4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["task"], r["method"]) for r in rows] == [("chat", "none"), ("chat", "ngram"), ("rewrite", "none"),
                                                        ("rewrite", "ngram")]


def test_pass_costs_table_and_json(tmp_path, capsys, monkeypatch):
    """--pass-costs times passes over 1/2/4/8/16/32 tokens and states the weight bytes a pass reads
    (the embedding table left out: a pass reads one row of it) and the bandwidth bound."""
    monkeypatch.delenv("SPECDEC_LLAMA_CPP", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama.cpp build: specdec's curve only
    target = make_model_dir(tmp_path / "t", layers=2, max_pos=2048)
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", str(target), "--methods", "none", "--temperatures", "0", "--tasks", "code",
                 "--prompts", "1", "--max-new-tokens", "4", "--pass-costs", "--json", str(out)]) == 0
    [curve] = json.loads(out.read_text())["pass_costs"]
    assert curve["engine"] == "specdec" and sorted(map(int, curve["ms_per_pass"])) == [1, 2, 4, 8, 16, 32]
    assert all(ms > 0 for ms in curve["ms_per_pass"].values())
    model = specdec.load(target).engine.target.model
    embedding = model.model.embed_tokens.weight
    everything = sum(t.numel() * t.element_size() for t in model.parameters())
    assert curve["bytes_per_pass"] == everything - embedding.numel() * embedding.element_size()
    assert curve["bound_tokens_per_second"] > 0
    table = capsys.readouterr().out
    assert "ms per target pass" in table and "T=8 / T=1" in table and "of bound" in table


def test_compiled_pass_costs_time_the_compiled_passes_too(tmp_path):
    """What `bench --pass-costs` adds when NAME@compile methods ran (no llama.cpp build given)."""
    from specdec.bench.pass_costs import pass_cost_curves

    target = make_model_dir(tmp_path / "t", layers=2, max_pos=2048)
    eager, compiled = pass_cost_curves(target, "float32", None, 32, None, None, compiled=True)
    assert (eager.engine, compiled.engine) == ("specdec", "specdec --compile")
    assert sorted(compiled.ms_per_pass) == [1, 2, 4, 8, 16, 32] and all(ms > 0 for ms in compiled.ms_per_pass.values())
    assert compiled.bytes_per_pass == eager.bytes_per_pass
