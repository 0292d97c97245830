
import pytest

from specdec.text import TextStream, TextTokenizer

from helpers import make_model_dir


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer(make_model_dir(tmp_path_factory.mktemp("tok"), layers=1))


def test_streaming_multibyte_utf8_split_across_tokens(tokenizer):
    text = "naïve 日本語 🙂 ok"
    ids = tokenizer.encode(text)
    # byte-level tokens split multi-byte characters; feed one token at a time
    stream = TextStream(tokenizer)
    pieces = [stream.push([i]) for i in ids]
    pieces.append(stream.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_truncates_and_never_leaks(tokenizer):
    text = "def add(a, b):\n    return a + b\n"
    stream = TextStream(tokenizer, stop=("return",))
    out = ""
    for i in tokenizer.encode(text):
        out += stream.push([i])
        if stream.stopped:
            break
    out += stream.finish()
    assert stream.stopped
    assert out == "def add(a, b):\n    "


def test_indentation_round_trips(tokenizer):
    code = "class A:\n\tdef f(self):\n        if x:\n            return  1\n\n\n"
    assert tokenizer.decode(tokenizer.encode(code)) == code
