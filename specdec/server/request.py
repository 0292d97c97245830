"""The checked request that validation.RequestParser makes of a body and the routes answer:
its prompts, choices and sampling settings."""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.chat.tools import ToolSettings
from specdec.engine.decoder import SpecDecoder
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.server.errors import bad_request


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str = ""  # completions: the prompt as text (for echo and text_offset)


@dataclass
class GenerationRequest:
    """A checked request. Completions may batch prompts: choice p * n + i is the i-th of
    prompt p's n choices (OpenAI's numbering); chat has one prompt."""
    kind: str  # "completion" | "chat"
    prompts: list[Prompt]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    sampling: dict = field(default_factory=dict)  # SamplingParams fields except seed
    seed: int | None = None
    user: str | None = None
    logprobs: int | None = None  # None: no logprobs; N: with the N most likely alternatives
    echo: bool = False  # completions: the prompt is prepended to each choice's text
    tools: ToolSettings | None = None  # chat with tools: replies are parsed for tool calls

    @property
    def prompt_ids(self) -> list[int]:
        """The (first) prompt's ids."""
        return self.prompts[0].ids

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        """usage.prompt_tokens: each prompt counted once, whatever n is."""
        return sum(len(p.ids) for p in self.prompts)

    def prompt_of(self, choice: int) -> Prompt:
        return self.prompts[choice // self.n]

    def sampling_params(self) -> list[SamplingParams]:
        """Per-choice SamplingParams: the i-th choice of a prompt uses seed + i when a seed is
        given (so a prompt in a batch gets the choices it would get alone); a setting the
        sampler refuses is a 400 here, before the request is queued."""
        try:
            return [SpecDecoder.sampling_params(**self.sampling,
                                                seed=None if self.seed is None else self.seed + choice % self.n)
                    for choice in range(self.num_choices)]
        except SpecdecError as e:
            raise bad_request(str(e)) from None
