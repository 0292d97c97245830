"""`specdec chat`: an interactive, streaming chat with the target in the terminal.

Each user line is appended to the conversation, the model's own chat template renders the whole
conversation (ChatML for SmolLM2; the plain "role: content" default for models without one),
and the answer streams to stdout, followed by a stats line on stderr. The answer ends at one of
the model's EOS ids, among which a chat model's end-of-turn token is (SmolLM2: <|im_end|>).

Ctrl-C during an answer stops that answer only. What was shown so far stays in the conversation
as the assistant's message: the history then matches the screen, so a next line such as "shorter,
please" refers to what the user saw (and user/assistant turns keep alternating, which some
templates insist on). Ctrl-C or Ctrl-D at the prompt, or the end of stdin, ends the program.

When the conversation no longer leaves room for an answer, the oldest exchanges are dropped (and
the user is told); a single message too long for the context window is refused."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from specdec.chat.template import ChatTemplate, ChatTemplateError
from specdec.cli.common import add_model_args, add_sampling_args, load_decoder, sampling, stats_line
from specdec.engine.decoder import SpecDecoder
from specdec.stats import GenerationStats

COMMANDS = {"/reset": "start a new conversation", "/exit": "end the chat"}
DEFAULT_MAX_NEW_TOKENS = 512  # answers run longer than `generate`'s completions (128)
# the plain default template lays the chat out as "user: ...\nassistant: ..."; without a
# template-specific end-of-turn token, stop where the model starts writing the user's next line
DEFAULT_TEMPLATE_STOP = "\nuser:"


@dataclass
class Conversation:
    template: ChatTemplate
    system: str | None = None
    turns: list[dict] = field(default_factory=list)  # user/assistant messages, oldest first

    def messages(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.turns

    def render(self) -> str:
        return self.template.render(self.messages())

    def drop_oldest_exchange(self) -> None:
        del self.turns[:2]  # a user message and the answer to it


def fit_prompt(conv: Conversation, decoder: SpecDecoder, answer_room: int) -> tuple[list[int], int]:
    """Prompt ids of the conversation, after dropping the oldest exchanges until the prompt
    leaves `answer_room` tokens of the context window (the latest message is never dropped).
    Returns (ids, exchanges dropped); ids may still leave less room, or none."""
    dropped = 0
    while True:
        ids = decoder.tokenizer.encode(conv.render())
        if len(ids) + answer_room <= decoder.context_window or len(conv.turns) <= 1:
            return ids, dropped
        conv.drop_oldest_exchange()
        dropped += 1


def read_line(prompt: str) -> str | None:
    """The next line from the user; None at the end (EOF, or Ctrl-C at the prompt)."""
    try:
        return input(prompt)
    except (EOFError, KeyboardInterrupt):
        if prompt:
            sys.stdout.write("\n")  # leave the terminal on a fresh line
        return None


def answer(decoder: SpecDecoder, prompt_ids: list[int], options: dict) -> tuple[str, str]:
    """Stream one answer to stdout; return (its text, a note for stderr). Ctrl-C stops it and
    returns what was shown so far."""
    shown, steps = [], GenerationStats(decoder.method)
    started = time.perf_counter()
    stream = decoder.stream(prompt_ids, **options)
    try:
        for chunk in stream:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            shown.append(chunk.text)
            if chunk.step is not None:
                steps.add(chunk.step)
            if chunk.result is not None:
                return chunk.result.text, stats_line(chunk.result.stats) + finish_note(chunk.result, options)
    except KeyboardInterrupt:
        steps.wall_seconds = time.perf_counter() - started
        return "".join(shown), "[answer stopped (Ctrl-C)] " + stats_line(steps)
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    return "".join(shown), ""  # a stream without a final result (not the engine's)


def finish_note(result, options: dict) -> str:
    if result.finish_reason != "length":
        return ""
    if len(result.token_ids) >= options["max_new_tokens"]:
        return f" [answer cut at --max-new-tokens {options['max_new_tokens']}]"
    return " [answer cut: the context window is full; /reset starts over]"


def cmd_chat(args: argparse.Namespace) -> int:
    decoder = load_decoder(args)
    options = sampling(args)
    decoder.sampling_params(**options)  # validate before the first prompt
    conv = Conversation(ChatTemplate.from_tokenizer_config(decoder.tokenizer.config), args.system)
    if conv.template.is_default:
        options["stop"] = (*options["stop"], DEFAULT_TEMPLATE_STOP)
    answer_room = min(options["max_new_tokens"], decoder.context_window // 2)
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
        template = "the plain default template" if conv.template.is_default else "the model's chat template"
        print(f"chatting with {decoder.target_path.name} (method {decoder.method}, {template}); "
              f"{', '.join(COMMANDS)}; Ctrl-C stops an answer, Ctrl-D ends", file=sys.stderr)
    turn = 0
    while (line := read_line("> " if interactive else "")) is not None:
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and " " not in text:
            if text == "/exit":
                break
            if text == "/reset":
                conv.turns.clear()
                print("[new conversation]", file=sys.stderr)
            else:
                print(f"[unknown command {text}; commands: "
                      f"{', '.join(f'{c} ({h})' for c, h in COMMANDS.items())}]", file=sys.stderr)
            continue
        conv.turns.append({"role": "user", "content": line})
        try:
            ids, dropped = fit_prompt(conv, decoder, answer_room)
        except ChatTemplateError as e:
            conv.turns.pop()
            print(f"[the chat template refused this conversation: {e}; /reset starts over]", file=sys.stderr)
            continue
        if dropped:
            print(f"[context window full: dropped the oldest {dropped} exchange(s)]", file=sys.stderr)
        if len(ids) >= decoder.context_window:
            conv.turns.pop()
            print(f"[message not sent: the prompt would be {len(ids)} tokens and the context window is "
                  f"{decoder.context_window}]", file=sys.stderr)
            continue
        seed = None if args.seed is None else args.seed + turn
        reply, note = answer(decoder, ids, {**options, "seed": seed})
        conv.turns.append({"role": "assistant", "content": reply})
        turn += 1
        if note:
            print(note, file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("chat", help="interactive streaming chat with the model's own chat template")
    add_model_args(c)
    add_sampling_args(c)
    c.set_defaults(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    c.add_argument("--system", default=None, help="system prompt (default: none, or the template's own)")
    c.set_defaults(func=cmd_chat)
