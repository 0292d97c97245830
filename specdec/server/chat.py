"""Chat messages -> one prompt string: the request's `messages` array is checked
(parse_messages), then rendered.

When the model's tokenizer_config.json has a `chat_template` (a Jinja template, as in Hugging
Face models), it is rendered in jinja2's ImmutableSandboxedEnvironment with `messages`,
`add_generation_prompt=True`, `bos_token`, `eos_token` and the `raise_exception` helper.
A template is never taken from a request.

Otherwise the plain default is used: one line per message, "<role>: <content>\\n", then
"assistant: " so that the model writes the assistant's reply. For example
[{"role": "user", "content": "hi"}] becomes "user: hi\\nassistant: "."""
from __future__ import annotations

from datetime import datetime

from specdec.errors import SpecdecError
from specdec.server.errors import bad_request
from specdec.server.fields import check_text, describe, short

CHAT_ROLES = ("system", "developer", "user", "assistant")

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
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise SpecdecError("the model's tokenizer_config.json has a chat_template; rendering it "
                               "needs jinja2 (pip install jinja2)") from None

        def raise_exception(message):
            raise ChatTemplateError(str(message))

        def strftime_now(fmt):
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
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

    def render(self, messages: list[dict]) -> str:
        if self.template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - a sandbox violation, an undefined name, a type error...
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None


def parse_messages(body: dict) -> list[dict]:
    """body["messages"] as [{"role", "content"[, "name"]}], text parts joined into one string."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("missing required parameter 'messages'", "messages")
    if not isinstance(messages, list):
        raise bad_request(f"messages must be an array of message objects, got {describe(messages)}",
                          "messages")
    if not messages:
        raise bad_request("messages must hold at least one message", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(m, where: str) -> dict:
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object with 'role' and 'content', got {describe(m)}", where)
    role = m.get("role")
    if role not in CHAT_ROLES:
        roles = ", ".join(repr(r) for r in CHAT_ROLES)
        shown = ("missing" if role is None else repr(short(role)) if isinstance(role, str)
                 else describe(role))
        raise bad_request(f"{where}.role must be one of {roles}, got {shown}", f"{where}.role")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"{where}.content[{j}] must be a text part "
                                  "{\"type\": \"text\", \"text\": \"...\"} (other content types "
                                  "are not supported)", f"{where}.content")
            parts.append(part["text"])
        content = "".join(parts)
    elif not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or an array of text parts, got "
                          f"{'missing' if 'content' not in m else describe(content)}", f"{where}.content")
    out = {"role": role, "content": check_text(content, f"{where}.content")}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"{where}.name must be a string, got {describe(name)}", f"{where}.name")
        out["name"] = check_text(name, f"{where}.name")
    return out
