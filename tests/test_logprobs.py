"""Log-probabilities of emitted and prompt tokens: for every method they are the target's raw
distribution at each position (checked against a full forward pass, independent of caches,
drafts and verification), streamed chunk by chunk; token bytes, text and offsets for the API;
the CLI's --logprobs."""
import json

import pytest
import torch

import specdec
from specdec.cli.main import main
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.models.bundled import DEFAULT_TARGET
from specdec.sampling import SamplingParams
from specdec.sampling.logprobs import TextOffsets, token_texts

from helpers import SAMPLE_TEXT, make_eagle_dir, make_medusa_dir, make_model_dir

PROMPT = "".join(SAMPLE_TEXT[:3])  # long enough for prompt lookup to find matches
TOP = 3


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_model_dir(tmp_path_factory.mktemp("t"), layers=2, kv_heads=1, max_pos=256)
    # the same weights, scaled: a draft that often agrees with the target but is not it
    draft = make_model_dir(tmp_path_factory.mktemp("d"), layers=2, kv_heads=1, max_pos=256, scale=0.9)
    return target, {"none": None, "draft": draft, "ngram": None,
                    "medusa": make_medusa_dir(tmp_path_factory.mktemp("m"), target),
                    "eagle": make_eagle_dir(tmp_path_factory.mktemp("e"), target)}


def full_pass_logprobs(decoder, ids: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits over the whole sequence in one cache-free pass:
    row j is the distribution of ids[j + 1]."""
    with torch.no_grad():
        return torch.log_softmax(decoder.engine.target.model(torch.tensor([ids]))[0].double(), -1)


def check_against_full_pass(decoder, prompt_ids: list[int], result) -> None:
    ids = prompt_ids + result.token_ids
    want = full_pass_logprobs(decoder, ids)[len(prompt_ids) - 1:-1]
    assert [e.token for e in result.token_logprobs] == result.token_ids
    got = torch.tensor([e.logprob for e in result.token_logprobs], dtype=torch.float64)
    assert torch.allclose(got, want[torch.arange(len(result.token_ids)), result.token_ids], atol=1e-9)
    for e, row in zip(result.token_logprobs, want):
        top = row.topk(TOP)
        assert [t for t, _ in e.top] == top.indices.tolist()
        assert torch.allclose(torch.tensor([lp for _, lp in e.top], dtype=torch.float64), top.values, atol=1e-9)


SETTINGS = [dict(), dict(temperature=0.9, top_k=20, seed=3),
            dict(temperature=1.0, seed=5, presence_penalty=1.0, repetition_penalty=1.3, logit_bias={7: 3.0})]


@pytest.mark.parametrize("kw", SETTINGS, ids=["greedy", "sampled", "penalized"])
@pytest.mark.parametrize("method", ["none", "draft", "ngram", "medusa", "eagle"])
def test_logprobs_are_the_targets_raw_distribution(dirs, method, kw):
    """Accepted drafts and bonus tokens alike: the target's log_softmax at that position,
    not the draft's and not the processed distribution (penalties, temperature, top-k)."""
    target, drafters = dirs
    decoder = specdec.load(target=target, draft=drafters[method], method=method, dtype="float64",
                           draft_tokens=None if method == "none" else 4 if method in ("draft", "ngram") else 8)
    prompt_ids = decoder.tokenizer.encode(PROMPT)
    result = decoder.generate(prompt_ids, max_new_tokens=24, ignore_eos=True, logprobs=TOP, **kw)
    check_against_full_pass(decoder, prompt_ids, result)
    if method != "none":
        assert result.stats.drafted_tokens > 0
    if method == "draft":
        assert result.stats.accepted_tokens > 0  # (random heads rarely agree: trees are covered below)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_tree_logprobs_on_the_bundled_models(method):
    """Trained heads: long accepted paths, whose rows' logprobs must be the target's."""
    decoder = specdec.load(method=method, dtype="float64", draft_tokens=16)
    prompt_ids = decoder.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    result = decoder.generate(prompt_ids, max_new_tokens=32, logprobs=TOP)
    check_against_full_pass(decoder, prompt_ids, result)
    assert result.stats.accepted_tokens >= 8


def test_prompt_logprobs_and_streaming(dirs):
    target, drafters = dirs
    decoder = specdec.load(target=target, draft=drafters["draft"], method="draft", dtype="float64", draft_tokens=3)
    prompt_ids = decoder.tokenizer.encode(PROMPT)
    kw = dict(max_new_tokens=20, temperature=0.8, seed=1, logprobs=1, prompt_logprobs=2)
    chunks = list(decoder.stream(prompt_ids, **kw))
    result = chunks[-1].result
    rows = full_pass_logprobs(decoder, prompt_ids)
    prompt = result.prompt_logprobs
    assert prompt[0] is None and len(prompt) == len(prompt_ids)
    assert [e.token for e in prompt[1:]] == prompt_ids[1:]
    assert torch.allclose(torch.tensor([e.logprob for e in prompt[1:]], dtype=torch.float64),
                          rows[torch.arange(len(prompt_ids) - 1), prompt_ids[1:]], atol=1e-9)
    assert all([t for t, _ in e.top] == row.topk(2).indices.tolist() for e, row in zip(prompt[1:], rows))
    # the prompt's logprobs ride on the first chunk only; every chunk carries its tokens' entries
    assert chunks[0].prompt_logprobs == prompt and all(c.prompt_logprobs is None for c in chunks[1:])
    assert all(len(c.token_logprobs) == len(c.token_ids) for c in chunks)
    assert [e for c in chunks for e in c.token_logprobs] == result.token_logprobs
    assert [e.token for e in result.token_logprobs] == result.token_ids
    assert result.stats.accepted_tokens > 0 and len(chunks) > 2


def test_logprobs_follow_the_cut_tokens(dirs):
    """A stop string or max_new_tokens cuts the step's tokens: the logprobs are cut alike."""
    target, drafters = dirs
    decoder = specdec.load(target=target, draft=drafters["draft"], method="draft", draft_tokens=6)
    full = decoder.generate(PROMPT, max_new_tokens=30, logprobs=0)
    stop = full.text[10:12]
    for result in (decoder.generate(PROMPT, max_new_tokens=7, logprobs=0),
                   decoder.generate(PROMPT, max_new_tokens=30, logprobs=0, stop=(stop,))):
        assert [e.token for e in result.token_logprobs] == result.token_ids
        assert all(e.top == () for e in result.token_logprobs)


def test_off_by_default(dirs):
    target, _ = dirs
    decoder = specdec.load(target=target)
    chunks = list(decoder.stream("def", max_new_tokens=4))
    assert all(c.token_logprobs is None and c.prompt_logprobs is None for c in chunks)
    assert chunks[-1].result.token_logprobs is None and chunks[-1].result.prompt_logprobs is None


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, True, 1.0, "2"])
def test_bad_logprobs_values_are_refused(name, value):
    with pytest.raises(SpecdecError, match=name):
        SamplingParams(**{name: value})


# ---------------------------------------------------------------- tokens as bytes and text

TEXT = "héllo wörld — ünïcödé 日本語 テキスト 🙂\n    return a + b\n"


@pytest.mark.parametrize("kind", ["bundled", "char"])
def test_token_bytes_rebuild_the_text(kind, tmp_path):
    if kind == "bundled":
        tokenizer = TextTokenizer(DEFAULT_TARGET)  # byte-level BPE
        text = TEXT
    else:
        tokenizer = TextTokenizer(make_model_dir(tmp_path / "c", tokenizer="char", vocab_size=20))
        text = "abcabba"
    texts = token_texts(tokenizer)
    ids = tokenizer.encode(text)
    assert b"".join(texts.token_bytes(t) for t in ids) == text.encode("utf-8")
    for t in ids:
        data = texts.token_bytes(t)
        try:
            assert texts.text(t) == data.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: shown byte by byte, as OpenAI does
            assert texts.text(t) == "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    if kind == "bundled":
        assert any(texts.text(t).startswith("bytes:") for t in ids)  # the case above was exercised


def test_text_offsets_count_whole_characters():
    offsets = TextOffsets(5)
    pieces = [b"ab", "é".encode()[:1], "é".encode()[1:] + b"c", b"d"]
    assert [offsets.next(p) for p in pieces] == [5, 7, 7, 9]


# ---------------------------------------------------------------- CLI

def test_cli_logprobs_and_penalties(capsys, dirs):
    target, _ = dirs
    code = main(["generate", "def f", "--target", str(target), "--json", "--max-new-tokens", "6", "--logprobs", "2",
                 "--presence-penalty", "0.5", "--frequency-penalty", "0.5", "--repetition-penalty", "1.2"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    sample = out["samples"][0]
    want = specdec.load(target=target).generate("def f", max_new_tokens=6, logprobs=2, presence_penalty=0.5,
                                                frequency_penalty=0.5, repetition_penalty=1.2)
    assert sample["token_ids"] == want.token_ids
    assert [e["token_id"] for e in sample["logprobs"]] == want.token_ids
    assert [e["logprob"] for e in sample["logprobs"]] == pytest.approx([e.logprob for e in want.token_logprobs])
    assert all(len(e["top_logprobs"]) == 2 for e in sample["logprobs"])

    assert main(["generate", "def f", "--target", str(target), "--logprobs", "2"]) == 2
    assert "--json" in capsys.readouterr().err
    assert main(["generate", "def f", "--target", str(target), "--json", "--presence-penalty", "3"]) == 2
    assert "presence_penalty" in capsys.readouterr().err
