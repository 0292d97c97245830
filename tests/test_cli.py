"""Every bad input is one clear line on stderr and exit code 2, never a traceback."""
import json
import subprocess
import sys

import pytest

from specdec.cli import main

from helpers import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("cli"), layers=1)


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("cli2"), layers=1, tokenizer="char", vocab_size=40)


def run(capsys, *argv):
    try:
        code = main(list(map(str, argv)))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_shape(capsys, model_dir):
    code, out, err = run(capsys, "generate", "def f", "--target", model_dir, "--json", "--max-new-tokens", 8,
                         "--n", 2, "--temperature", 0.9, "--seed", 1)
    assert code == 0
    d = json.loads(out)
    assert len(d["samples"]) == 2 and all(len(s["token_ids"]) == 8 for s in d["samples"])
    for key in ("method", "new_tokens", "target_forwards", "drafted_tokens", "accepted_tokens",
                "acceptance_rate", "mean_accepted_length", "tokens_per_second", "wall_seconds"):
        assert key in d["stats"]
    assert d["stats"]["method"] == "none" and d["stats"]["new_tokens"] == 16
    assert d["stats"]["drafted_tokens"] == 0 and d["stats"]["acceptance_rate"] is None


def test_generate_streams_text_and_summary(capsys, model_dir):
    code, out, err = run(capsys, "generate", "def f", "--target", model_dir, "--max-new-tokens", 5,
                         "--method", "ngram")
    assert code == 0 and out.startswith("def f")
    assert "method=ngram" in err and "new_tokens=5" in err


BAD = [
    (["--target", "/nonexistent/model"], "does not exist"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-2"], "top_k"),
    (["--min-p", "2"], "min_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--n", "0"], "--n"),
    (["--dtype", "int8"], "dtype"),
    (["--method", "medusa-x"], "method"),
    (["--temperature", "abc"], "temperature"),
    (["--draft-tokens", "0"], "draft_tokens"),
    (["--draft-tokens", "100000"], "draft_tokens"),
    (["--method", "draft"], "draft"),  # custom target and no draft given
]


@pytest.mark.parametrize("extra,needle", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_is_one_clear_line(capsys, model_dir, extra, needle):
    argv = ["generate", "def", "--max-new-tokens", "4"]
    if "--target" not in extra:
        argv += ["--target", str(model_dir)]
    code, out, err = run(capsys, *argv, *extra)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_non_hf_folder(capsys, tmp_path):
    code, _, err = run(capsys, "generate", "x", "--target", tmp_path)
    assert code == 2 and "config.json" in err


def test_unsupported_model_type_names_supported(capsys, model_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "falcon-x"
    (bad / "config.json").write_text(json.dumps(cfg))
    code, _, err = run(capsys, "generate", "x", "--target", bad, "--backend", "native")
    assert code == 2 and "llama, mistral, qwen2" in err


def test_pickle_checkpoint_refused(capsys, model_dir, tmp_path):
    import shutil

    bad = tmp_path / "pkl"
    shutil.copytree(model_dir, bad)
    (bad / "model.safetensors").unlink()
    (bad / "pytorch_model.bin").write_bytes(b"not really a pickle")
    code, _, err = run(capsys, "generate", "x", "--target", bad)
    assert code == 2 and "safetensors" in err and "pytorch_model.bin" in err


def test_prompt_longer_than_context(capsys, model_dir):
    code, _, err = run(capsys, "generate", "def f(x): return x\n" * 200, "--target", model_dir)
    assert code == 2 and "context window" in err


def test_draft_vocab_mismatch_names_both_sizes(capsys, model_dir, other_vocab_dir):
    code, _, err = run(capsys, "generate", "x", "--target", model_dir, "--method", "draft",
                       "--draft", other_vocab_dir)
    assert code == 2 and "40" in err and "vocabulary" in err


def test_console_script_reports_without_traceback(model_dir):
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "x", "--target", str(model_dir),
                           "--top-p", "7"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "top_p" in proc.stderr
