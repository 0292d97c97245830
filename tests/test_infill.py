"""Fill in the middle: FIM prompts (fim.py), the stop rules they need (stop_token_ids,
line_time_limit), Decoder.infill, and the server's /infill (llama.cpp's shape) and
/v1/completions `suffix`."""
from __future__ import annotations

import json

import httpx
import pytest
from test_server import LiveServer, one_torch_thread  # noqa: F401 (autouse: one torch thread)

import specdec
from specdec.chat.fim import FAMILIES, fim_prompt, find_fim_tokens, require_fim_tokens
from specdec.errors import SpecdecError

from helpers import make_model_dir, on_the_stack

QWEN = FAMILIES[0]
MARKERS = (QWEN.prefix, QWEN.suffix, QWEN.middle, "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")
PREFIX = "def add(a, b):\n"
SUFFIX = "\n\nfor i in range(10):\n    print(add(i, i))\n"
N = 10


class WordTokenizer:
    """One token per character, markers by their text: prompt layouts readable in tests."""

    def __init__(self, markers=MARKERS):
        self.markers = {m: 1000 + i for i, m in enumerate(markers)}

    def token_id(self, text):
        return self.markers.get(text)

    def encode(self, text):
        return [ord(c) for c in text]


@pytest.fixture(scope="module")
def fim_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("fim") / "tiny", special_tokens=MARKERS)


@pytest.fixture(scope="module")
def plain(fim_dir):
    return on_the_stack(specdec.load(fim_dir))  # its stop test checks prefix reuse


# ---------------------------------------------------------------- prompts

def test_families_are_found_by_their_spelling():
    tok = WordTokenizer()
    fim = find_fim_tokens(tok)
    assert (fim.prefix, fim.suffix, fim.middle, fim.file_sep) == (1000, 1001, 1002, 1004)
    assert set(fim.ends) == {1000, 1001, 1002, 1003, 1004, 1005}
    starcoder = find_fim_tokens(WordTokenizer(("<fim_prefix>", "<fim_suffix>", "<fim_middle>")))
    assert (starcoder.prefix, starcoder.suffix, starcoder.middle, starcoder.file_sep) == (1000, 1001, 1002, None)
    assert find_fim_tokens(WordTokenizer(("<|fim_prefix|>", "<|fim_middle|>"))) is None  # no suffix marker
    with pytest.raises(SpecdecError, match="no fill-in-the-middle tokens.*qwen-coder"):
        require_fim_tokens(WordTokenizer(()))


def test_prompt_layout_prefix_suffix_middle_after_the_context_files():
    tok = WordTokenizer()
    fim = find_fim_tokens(tok)
    p = fim_prompt(tok, fim, "ab", "cd", extra=[("x.py", "y")], typed="e")
    assert p.ids == [1004, *map(ord, "x.py\ny"), 1000, ord("a"), ord("b"), 1001, ord("c"), ord("d"), 1002, ord("e")]
    assert not p.truncated and (p.prefix_tokens, p.suffix_tokens, p.extra_files) == (2, 2, 1)
    assert p.stop_token_ids == fim.ends


def test_a_long_prompt_keeps_the_text_nearest_the_gap():
    tok = WordTokenizer()
    fim = find_fim_tokens(tok)
    prefix, suffix = "p" * 30 + "P", "S" + "s" * 30
    whole = fim_prompt(tok, fim, prefix, suffix, extra=[("a", "old"), ("b", "new")])
    assert len(whole.ids) == 3 + 31 + 31 + 6 + 6 and not whole.truncated
    fits = fim_prompt(tok, fim, prefix, suffix, extra=[("a", "old"), ("b", "new")], budget=len(whole.ids) - 1)
    assert fits.truncated and fits.extra_files == 1 and fits.ids[1:6] == list(map(ord, "b\nnew"))  # oldest dropped
    cut = fim_prompt(tok, fim, prefix, suffix, budget=43)  # 40 tokens of text: prefix 30, suffix 10
    assert cut.truncated and len(cut.ids) == 43 and (cut.prefix_tokens, cut.suffix_tokens) == (30, 10)
    assert cut.ids[30] == ord("P") and cut.ids[31] == 1001 and cut.ids[32] == ord("S")  # the cursor's sides kept
    short_prefix = fim_prompt(tok, fim, "ab", suffix, budget=20)  # the suffix takes what the prefix leaves
    assert (short_prefix.prefix_tokens, short_prefix.suffix_tokens) == (2, 15)
    with pytest.raises(SpecdecError, match="at least 4 tokens"):
        fim_prompt(tok, fim, prefix, suffix, budget=3)


# ---------------------------------------------------------------- stop rules

def test_stop_token_ids_end_the_generation(plain):
    full = plain.generate(PREFIX, temperature=0, max_new_tokens=N, ignore_eos=True)
    assert len(full.token_ids) == N
    stop_at = full.token_ids[3]
    first = full.token_ids.index(stop_at)
    cut = plain.generate(PREFIX, temperature=0, max_new_tokens=N, ignore_eos=True, stop_token_ids=[stop_at])
    assert cut.token_ids == full.token_ids[:first + 1] and cut.finish_reason == "stop"
    # the second generation reuses the first's prompt rows (its layers run in one call: models/stack.py)
    assert cut.stats.cached_prompt_tokens == len(plain.tokenizer.encode(PREFIX)) - 1
    with pytest.raises(SpecdecError, match="stop_token_ids"):
        plain.generate(PREFIX, stop_token_ids=[-1])


def test_line_time_limit_ends_at_a_line_break_once_past(plain):
    newline = plain.tokenizer.encode("\n")[0]
    forced = dict(temperature=0, max_new_tokens=N, ignore_eos=True, logit_bias={newline: 100})
    assert len(plain.generate(PREFIX, **forced).token_ids) == N
    limited = plain.generate(PREFIX, **forced, line_time_limit=1e-9)
    assert limited.token_ids == [newline] and limited.finish_reason == "length"
    no_break = plain.generate("x", temperature=0, max_new_tokens=N, ignore_eos=True, line_time_limit=1e-9,
                              logit_bias={newline: -100})
    assert len(no_break.token_ids) == N  # never a line break: the limit waits for one


# ---------------------------------------------------------------- the library

@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_infill_is_generate_on_the_fim_prompt_for_every_method(fim_dir, plain, method):
    fim = find_fim_tokens(plain.tokenizer)
    ids = [fim.prefix, *plain.tokenizer.encode(PREFIX), fim.suffix, *plain.tokenizer.encode(SUFFIX), fim.middle]
    want = plain.generate(ids, temperature=0, max_new_tokens=N, stop_token_ids=fim.ends)
    assert plain.infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N).token_ids == want.token_ids
    spec = specdec.load(fim_dir, fim_dir if method == "draft" else None, method=method, draft_tokens=3)
    assert spec.infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N).token_ids == want.token_ids


def test_a_model_without_fim_tokens_says_so(tmp_path):
    decoder = specdec.load(make_model_dir(tmp_path / "plain"))
    assert decoder.fim_tokens() is None
    with pytest.raises(SpecdecError, match="no fill-in-the-middle tokens"):
        decoder.infill(PREFIX, SUFFIX)


def test_generate_cli_takes_a_suffix(fim_dir, capsys):
    from specdec.cli.main import main

    assert main(["generate", PREFIX, "--suffix", SUFFIX, "--target", str(fim_dir), "--method", "none",
                 "--temperature", "0", "--max-new-tokens", str(N), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = specdec.load(fim_dir).infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N)
    assert out["samples"][0]["token_ids"] == want.token_ids


# ---------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def server(fim_dir):

    from specdec.server.app import ServerSettings, create_app

    live = LiveServer(create_app(specdec.load(fim_dir, method="ngram"), ServerSettings(model_name="fim")))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_infill_answers_in_llama_cpps_shape(http, plain):
    want = plain.infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N)
    r = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": N,
                                   "temperature": 0, "cache_prompt": True, "samplers": ["top_k", "infill"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["content"] == want.text and body["tokens"] == want.token_ids and body["stop"] is True
    assert body["tokens_predicted"] == len(want.token_ids) and body["truncated"] is False
    assert body["stop_type"] == ("eos" if want.finish_reason == "stop" else "limit")
    assert body["timings"]["predicted_n"] == len(want.token_ids) and body["timings"]["prompt_n"] > 0
    assert body["model"] == "fim" and body["speculative"]["method"] == "ngram"
    picked = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": N,
                                        "temperature": 0, "response_fields": ["content", "timings/predicted_n",
                                                                              "nothing/here"]}).json()
    assert picked == {"content": want.text, "timings/predicted_n": len(want.token_ids)}


def test_infill_streams_a_data_line_per_step(http, plain):
    want = plain.infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N)
    with http.stream("POST", "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": N,
                                              "temperature": 0, "stream": True}) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == want.text
    assert events[-1]["tokens_predicted"] == len(want.token_ids)


def test_infill_cuts_a_long_input_and_says_so(http):
    r = http.post("/infill", json={"input_prefix": PREFIX * 100, "input_suffix": SUFFIX * 100, "n_predict": 8,
                                   "input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "temperature": 0})
    assert r.status_code == 200 and r.json()["truncated"] is True
    assert r.json()["timings"]["prompt_n"] <= 256 - 8


def test_completions_suffix_is_the_same_middle(http, plain):
    want = plain.infill(PREFIX, SUFFIX, temperature=0, max_new_tokens=N)
    r = http.post("/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": N, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text


@pytest.mark.parametrize("route,body,words", [
    ("/infill", {"input_prefix": 1}, "input_prefix must be a string"),
    ("/infill", {"input_extra": [{"filename": "a"}]}, "input_extra[0] needs \"text\""),
    ("/infill", {"input_extra": "x"}, "input_extra must be an array"),
    ("/infill", {"n_predict": -2}, "n_predict must be an integer >= -1"),
    ("/infill", {"n_predict": 256}, "context window"),
    ("/infill", {"n_predict": 0}, "n_predict must be -1"),
    ("/infill", {"seed": "x"}, "seed must be"),
    ("/infill", {"response_fields": "content"}, "response_fields must be an array"),
    ("/v1/completions", {"prompt": [PREFIX, PREFIX], "suffix": SUFFIX}, "suffix needs the prompt as one string"),
    ("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "echo": True}, "cannot be combined with echo"),
])
def test_bad_infill_input_is_a_clear_400(http, route, body, words):
    r = http.post(route, json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_a_model_without_fim_tokens_refuses_infill(tmp_path):

    from specdec.server.app import ServerSettings, create_app

    live = LiveServer(create_app(specdec.load(make_model_dir(tmp_path / "plain")), ServerSettings(model_name="m")))
    try:
        r = httpx.post(f"{live.url}/infill", json={"input_prefix": "a"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "fim_not_supported"
        r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "a", "suffix": "b"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "fim_not_supported"
        assert httpx.get(f"{live.url}/health", timeout=30).status_code == 200  # and keeps serving
    finally:
        live.stop()
