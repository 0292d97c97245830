"""Chat messages -> one prompt string, with the model's own chat template. Used by the server's
/v1/chat/completions and by `specdec chat`, so both render a conversation the same way.

When the model's tokenizer settings hold a `chat_template` (a Jinja template, as in Hugging
Face models: tokenizer_config.json, chat_template.jinja or a GGUF's tokenizer.chat_template),
it is rendered in jinja2's ImmutableSandboxedEnvironment with `messages`,
`add_generation_prompt=True`, `bos_token`, `eos_token` and the `raise_exception` helper.
jinja2 comes with the `chat` (or `server`) extra. A template is never taken from a request.

Otherwise the plain default is used: one line per message, "<role>: <content>\\n", then
"assistant: " so that the model writes the assistant's reply. For example
[{"role": "user", "content": "hi"}] becomes "user: hi\\nassistant: ". It is rendered in plain
Python, so models without a template chat without jinja2."""
from __future__ import annotations

from datetime import datetime

from specdec.errors import SpecdecError
from specdec.extras import require

DEFAULT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


class ChatTemplateError(Exception):
    """The template refused these messages (raise_exception) or failed on them."""


def _token_text(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} as in some tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _pick_template(source) -> str | None:
    """HF allows a list of named templates; use the one named 'default'."""
    if source is None or isinstance(source, str):
        return source
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise SpecdecError("tokenizer_config.json has a chat_template that is neither a string nor a list "
                       "with a template named 'default'")


class ChatTemplate:
    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = ""):
        self.is_default = source is None
        self.source = DEFAULT_TEMPLATE if source is None else source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.template = None
        if self.is_default:
            return  # rendered in plain Python (same output as DEFAULT_TEMPLATE): no jinja2 needed
        sandbox = require("jinja2.sandbox", "chat", "rendering the model's chat template")
        from jinja2 import TemplateError

        def raise_exception(message):
            raise ChatTemplateError(str(message))

        def strftime_now(fmt):
            return datetime.now().strftime(fmt)

        env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self.template = env.from_string(self.source)
        except TemplateError as e:
            raise SpecdecError(f"the model's chat_template does not compile: {e}") from None

    @classmethod
    def from_tokenizer_config(cls, config: dict) -> ChatTemplate:
        return cls(_pick_template(config.get("chat_template")), _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")))

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders `tools` itself (else specdec.chat.tools writes the tool prompt)."""
        return self.template is not None and "tools" in self.source

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt for the assistant's next message. tools: OpenAI tool objects, for a
        template that takes them."""
        if self.template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        extra = {"tools": tools} if tools else {}
        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - a sandbox violation, an undefined name, a type error...
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
