"""The llama-server driver (specdec.bench.llama_cpp) and the llama.cpp bench peer, against a fake
server (tests/fake_llama_server.py); plus one check against a real llama.cpp build, which
skips when none is found ($SPECDEC_LLAMA_CPP or llama-server on PATH)."""
import json
import os
import sys
from pathlib import Path

import pytest

import specdec
from specdec.bench.llama_cpp import ENV_VAR, LlamaServer, find_llama_server, server_version
from specdec.bench.peers import LlamaCppPeer
from specdec.cli.convert import convert
from specdec.cli.main import main
from specdec.errors import SpecdecError
from specdec.models.bundled import DEFAULT_TARGET

from helpers import make_model_dir

FAKE = Path(__file__).parent / "fake_llama_server.py"


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A folder holding an executable `llama-server` that runs the fake."""
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(0o755)
    return folder


@pytest.fixture
def gguf_file(tmp_path) -> Path:
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=512)
    return convert(target, tmp_path / "t.f32.gguf")


def test_find_llama_server_order(fake_bin, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert find_llama_server() is None
    assert find_llama_server(fake_bin) == fake_bin / "llama-server"
    monkeypatch.setenv(ENV_VAR, str(fake_bin))
    assert find_llama_server() == fake_bin / "llama-server"
    monkeypatch.setenv(ENV_VAR, str(tmp_path))  # a folder without the server
    with pytest.raises(SpecdecError, match="no executable llama-server"):
        find_llama_server()
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setenv("PATH", str(fake_bin))
    assert find_llama_server() == fake_bin / "llama-server"
    assert server_version(fake_bin / "llama-server") == "version: 0 (fake)"


class ByteTokens:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def test_server_round_trip_and_request_fields(fake_bin, gguf_file):
    server = LlamaServer(fake_bin / "llama-server", gguf_file, threads=1, spec="ngram")
    with server:
        done = server.complete([7, 8, 9], 5, temperature=0.7, seed=3)
        assert done.tokens == [10, 11, 12, 13, 14]
        assert (done.draft_n, done.draft_n_accepted, done.target_passes) == (5, 2, 3)
        assert done.seconds > 0
        stats = LlamaCppPeer("llama.cpp-ngram", server, ByteTokens()).run("abcd", 0.7, 5, seed=3)
        assert stats.prefill_seconds == 0.002 and stats.new_tokens == 5  # the server's prompt_ms
        sent = server._request("POST", "/completion", {"prompt": [1], "n_predict": 1})["request"]
        assert sent == {"prompt": [1], "n_predict": 1}
        assert server.tokenize("ab") == [ord("a") % 50, ord("b") % 50]
        assert server.peak_rss_bytes() > 1_000_000
        with pytest.raises(SpecdecError, match="answered 400 on /completion"):
            server.complete([], 3)
    assert server.process.poll() is not None  # stopped on exit
    assert not Path(server.log.name).exists()  # and its log removed


def test_completion_request_turns_off_llama_cpp_defaults(fake_bin, gguf_file, monkeypatch):
    """Prompt ids as given (no BOS), no prompt cache, temperature as the only sampler."""
    seen = {}
    with LlamaServer(fake_bin / "llama-server", gguf_file, threads=1) as server:
        real = server._request
        monkeypatch.setattr(server, "_request", lambda *a, **k: seen.setdefault("out", real(*a, **k)))
        server.complete([3, 4], 2, temperature=0.0, seed=5)
    request = seen["out"]["request"]
    assert request["prompt"] == [3, 4] and request["n_predict"] == 2 and request["seed"] == 5
    assert request["cache_prompt"] is False and request["ignore_eos"] is True
    assert request["samplers"] == ["temperature"] and request["repeat_penalty"] == 1.0


def test_server_that_fails_to_start_shows_its_log(fake_bin, gguf_file, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    with pytest.raises(SpecdecError, match="exited with status 1 while loading(.|\n)*failed to load model"):
        LlamaServer(fake_bin / "llama-server", gguf_file, threads=1).start()


def test_unknown_configuration_is_refused(fake_bin, gguf_file):
    with pytest.raises(SpecdecError, match="unknown llama.cpp configuration 'eagle'"):
        LlamaServer(fake_bin / "llama-server", gguf_file, threads=1, spec="eagle")


def test_bench_runs_llama_cpp_peer_on_a_gguf_of_the_target(fake_bin, tmp_path):
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", str(target), "--methods", "none,llama.cpp,llama.cpp-ngram",
                 "--llama-cpp", str(fake_bin), "--temperatures", "0", "--tasks", "code", "--prompts", "2",
                 "--max-new-tokens", "6", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["llama_cpp"]["version"] == "version: 0 (fake)"
    rows = {r["method"]: r for r in result["rows"]}
    for m in ("llama.cpp", "llama.cpp-ngram"):
        assert rows[m]["new_tokens"] == 12 and rows[m]["peak_rss_mb"] > 1 and rows[m]["model_memory_mb"] is None
        assert rows[m]["speedup"] == pytest.approx(rows[m]["tokens_per_second"] / rows["none"]["tokens_per_second"],
                                                   rel=0.01)
    assert rows["llama.cpp"]["mean_accepted_length"] is None
    # the fake accepts 3 of 6 drafts per prompt: 6 tokens in 3 passes
    assert rows["llama.cpp-ngram"]["mean_accepted_length"] == 2.0
    assert rows["llama.cpp-ngram"]["acceptance_rate"] == 0.5


def test_bench_runs_llama_cpp_with_the_same_draft_model(fake_bin, gguf_file, tmp_path):
    target = make_model_dir(tmp_path / "t2", layers=1, max_pos=2048)
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(target), "--methods", "llama.cpp-draft", "--llama-cpp", str(fake_bin),
            "--temperatures", "0", "--tasks", "code", "--prompts", "1", "--max-new-tokens", "6"]
    assert main([*args, "--draft", str(gguf_file), "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["method"] == "llama.cpp-draft" and row["acceptance_rate"] == 0.5
    assert main([*args, "--draft", str(target)]) == 2  # a folder, not a GGUF: llama.cpp cannot load it


def test_bench_llama_cpp_method_without_a_build_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    target = make_model_dir(tmp_path / "t", layers=1, max_pos=2048)
    assert main(["bench", "--target", str(target), "--methods", "none,llama.cpp", "--tasks", "code"]) == 2
    assert "needs a llama.cpp build" in capsys.readouterr().err


# ---------------------------------------------------------------- a real llama.cpp build

def real_server() -> Path:
    try:
        found = find_llama_server()
    except SpecdecError:
        found = None
    if found is None:
        pytest.skip(f"no llama.cpp build (set {ENV_VAR} or put llama-server on PATH)")
    return found


@pytest.mark.parametrize("outtype", ["f32", "bf16"])
def test_llama_cpp_runs_our_gguf_with_specdec_greedy_tokens(outtype, tmp_path):
    """`specdec convert` output loads in llama.cpp, which tokenizes as specdec does and
    decodes the same greedy tokens as specdec in float32 on that file."""
    binary = real_server()
    gguf = convert(DEFAULT_TARGET, tmp_path / f"pycode.{outtype}.gguf", outtype)
    decoder = specdec.load(target=gguf, dtype="float32")
    prompts = ["def parse(line):", "import os\n\nclass Config:\n    def", "héllo wörld = 12345  # ünï 🙂\n"]
    with LlamaServer(binary, gguf, threads=min(2, os.cpu_count() or 1), ctx=512) as server:
        for prompt in prompts:
            ids = decoder.tokenizer.encode(prompt)
            assert server.tokenize(prompt) == ids
            ours = decoder.generate(ids, temperature=0, max_new_tokens=32, ignore_eos=True).token_ids
            assert server.complete(ids, 32, temperature=0.0).tokens == ours
