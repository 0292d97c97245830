
import pytest

from specdec.engine.text import TextStream, TextTokenizer

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


@pytest.mark.parametrize("bundled", [False, True])
def test_incremental_decoding_matches_a_full_decode(tokenizer, bundled):
    """Random chunk sizes, random ids (which need not form valid UTF-8): the streamed text
    equals decoding everything at once."""
    import random

    from specdec.models.bundled import DEFAULT_TARGET

    tok = TextTokenizer(DEFAULT_TARGET) if bundled else tokenizer
    rnd = random.Random(0)
    for trial in range(20):
        ids = tok.encode("x = 'naïve 日本語 🙂'\n    return  a\t+ b\n")
        ids += [rnd.randrange(tok.vocab_size) for _ in range(60)]
        if trial % 2:
            rnd.shuffle(ids)
        stream = TextStream(tok)
        out, i = "", 0
        while i < len(ids):
            n = rnd.randint(1, 5)
            out += stream.push(ids[i:i + n])
            i += n
        out += stream.finish()
        assert out == tok.decode(ids)
