"""Every bad input is one clear line on stderr and exit code 2, never a traceback; a plain
install (no extras) generates and names the extra a command needs; packaging and layout."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.cli.main import main

from helpers import make_model_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("cli"), layers=1)


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    """A draft whose 40 tokens are Greek and Cyrillic letters: none is in the target's vocabulary."""
    letters = "".join(map(chr, range(0x3B1, 0x3C9))) + "".join(map(chr, range(0x430, 0x450)))
    return make_model_dir(tmp_path_factory.mktemp("cli2"), layers=1, tokenizer="char", vocab_size=40,
                          alphabet=letters)


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


def test_generate_with_a_grammar(capsys, model_dir, tmp_path):
    pytest.importorskip("llguidance")
    code, out, _ = run(capsys, "generate", "def f", "--target", model_dir, "--json", "--max-new-tokens", 30,
                       "--regex", "(yes|no|maybe)")
    assert code == 0 and json.loads(out)["samples"][0]["text"] in ("yes", "no", "maybe")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                  "additionalProperties": False}))
    code, out, _ = run(capsys, "generate", "def f", "--target", model_dir, "--json", "--max-new-tokens", 30,
                       "--json-schema", f"@{schema}", "--method", "ngram")
    assert code == 0 and json.loads(json.loads(out)["samples"][0]["text"]) in ({"ok": True}, {"ok": False})
    code, _, err = run(capsys, "generate", "def f", "--target", model_dir, "--regex", "(a")
    assert code == 2 and "regex" in err and "Traceback" not in err
    code, _, err = run(capsys, "generate", "def f", "--target", model_dir, "--json-schema", "@/nonexistent.json")
    assert code == 2 and "cannot read" in err


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
    (["--method", "draft"], "none is shipped for this target"),  # custom target and no draft given
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


def test_draft_sharing_no_tokens_is_refused(capsys, model_dir, other_vocab_dir):
    """Another vocabulary is drafted across (tests/test_cross_vocab.py) unless the draft can
    propose (almost) nothing: then the error says how many shared tokens are needed."""
    code, _, err = run(capsys, "generate", "x", "--target", model_dir, "--method", "draft",
                       "--draft", other_vocab_dir)
    assert code == 2 and "shares only 0 tokens" in err and "(of 40)" in err and "needs at least 10" in err


def test_console_script_reports_without_traceback(model_dir):
    proc = subprocess.run([sys.executable, "-m", "specdec.cli.main", "generate", "x", "--target", str(model_dir),
                           "--top-p", "7"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "top_p" in proc.stderr


# ---------------------------------------------------------------- optional extras

OPTIONAL = ("transformers", "rich", "matplotlib", "scipy", "fastapi", "uvicorn", "prometheus_client", "jinja2")

# Runs in a fresh interpreter where optional packages cannot be imported, as after a plain
# `pip install specdec`; argv: model folder, {case: [blocked packages, argv]}; prints
# {case: [exit code, stderr]} as JSON.
NO_EXTRAS_SCRIPT = r"""
import contextlib, io, json, sys
target, cases, out = sys.argv[1], json.loads(sys.argv[2]), {}
for name, (blocked, argv) in cases.items():
    for module in [m for m, v in sys.modules.items() if v is None and m not in blocked]:
        del sys.modules[module]  # unblock what the previous case blocked
    for module in blocked:
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[loaded]
        sys.modules[module] = None  # `import module` (and its submodules) now raises ImportError
    from specdec.cli.main import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([a.replace("TARGET", target) for a in argv])
        except SystemExit as e:
            code = e.code
    out[name] = [code, err.getvalue()]
print(json.dumps(out))
"""

# case: (argv, blocked packages, exit code, extra named in the error); "generate" comes first, so
# nothing optional has been imported before it; matplotlib is blocked alone in "bench plot" so
# that the bench table (rich) passes and --plot is what fails
NO_EXTRAS_CASES = {
    "generate": (["generate", "def f", "--target", "TARGET", "--max-new-tokens", "3"], OPTIONAL, 0, None),
    "transformers backend": (["generate", "x", "--target", "TARGET", "--backend", "transformers"], OPTIONAL, 2,
                             "hf"),
    "bench table": (["bench", "--target", "TARGET", "--methods", "none"], OPTIONAL, 2, "bench"),
    "verify chi-square": (["verify", "--target", "TARGET", "--method", "ngram", "--samples", "2"], OPTIONAL, 2,
                          "bench"),
    "train": (["train", "lm", "--out", "unused"], OPTIONAL, 2, "train"),
    "serve": (["serve", "--target", "TARGET"], OPTIONAL, 2, "server"),
    "bench plot": (["bench", "--target", "TARGET", "--methods", "none", "--plot", "x.png"], ["matplotlib"], 2,
                   "bench"),
}


def test_plain_install_generates_and_names_the_missing_extra(model_dir):
    cases = {name: [blocked, argv] for name, (argv, blocked, _, _) in NO_EXTRAS_CASES.items()}
    proc = subprocess.run([sys.executable, "-c", NO_EXTRAS_SCRIPT, str(model_dir), json.dumps(cases)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for name, (_, blocked, want_code, extra) in NO_EXTRAS_CASES.items():
        code, err = got[name]
        assert code == want_code, (name, err)
        if extra is None:
            assert "new_tokens=3" in err
        else:
            assert f"pip install 'specdec[{extra}]'" in err and "Traceback" not in err, (name, err)
            assert any(f"'{module}'" in err for module in blocked), (name, err)  # names the missing package


def test_extras_match_pyproject():
    """The extra an error message names really brings the missing package."""
    tomllib = pytest.importorskip("tomllib")
    from specdec.extras import EXTRAS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {re.split(r"[<>=!~\[ ]", req)[0].lower().replace("-", "_") for req in extras[extra]}
        assert set(modules) <= names, (extra, names)
    core = {re.split(r"[<>=!~ ]", req)[0] for req in project["dependencies"]}
    assert core == {"torch", "numpy", "safetensors", "tokenizers"}


# ---------------------------------------------------------------- packaging and layout

def test_one_version_source():
    tomllib = pytest.importorskip("tomllib")
    import specdec

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "specdec.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", specdec.__version__)
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def import_graph() -> dict[str, set[str]]:
    """specdec module -> specdec modules it imports, at module level or inside functions."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for f in (ROOT / "specdec").rglob("*.py")}
    graph = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg import submodule` needs the submodule, not what pkg/__init__ imports
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def test_no_import_cycles():
    graph = import_graph()
    assert graph["specdec.cli.main"] >= {"specdec.cli.common", "specdec.bench.methods", "specdec.cli.lossless_check"}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, path + [name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])
