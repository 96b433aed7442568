"""The body of ``POST /v1/completions`` (OpenAI's legacy text completions) as a pydantic model,
strict as JSON is.

What is served: ``prompt`` (a string, or a list of one string), ``suffix`` (fill-in-the-middle:
the reply is what goes between the prompt and the suffix, through the model's FIM tokens),
``max_tokens``, ``temperature``, ``top_p``, ``top_k`` (an extension), ``seed``, ``stop``,
``stream`` with ``stream_options.include_usage``, ``n`` = 1, ``best_of`` = 1, ``echo`` false and
``user``. What would change the reply in a way specchat cannot (token-id prompts, several
prompts, ``n`` or ``best_of`` > 1, ``echo``, log probabilities, penalties, ``logit_bias``) is
refused with its reason; any other field is accepted, ignored and named in the response's
``x-specchat-ignored`` header, as for the chat endpoint (``chatapp.serve.schemas``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from chatapp.api.exchange import ExchangeRequest, RawText
from chatapp.serve.errors import UNSUPPORTED
from chatapp.serve.schemas import StreamedRequest
from chatapp.settings.options import MAX_SEED

# Fields refused unless off, with what to say.
_REFUSED = {"logprobs": "log probabilities", "logit_bias": "logit biases",
            "frequency_penalty": "frequency penalties",
            "presence_penalty": "presence penalties"}
_OFF: tuple[Any, ...] = (None, 0, 0.0, {})


def _refused(what: str) -> PydanticCustomError:
    return PydanticCustomError(UNSUPPORTED, "{what} are not supported by specchat serve's "
                               "completions", {"what": what})


class CompletionRequest(StreamedRequest):
    model: str
    prompt: str | list[str]
    suffix: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=1)
    best_of: int | None = Field(None, ge=1, le=1)
    echo: bool = False
    user: str | None = None  # accepted, not used
    # Refused unless off (see _REFUSED).
    logprobs: int | None = None
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_text_prompt(cls, data: Any) -> Any:
        """A list prompt is one string: token ids and several prompts are refused by name."""
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if isinstance(prompt, list) and (len(prompt) != 1 or not isinstance(prompt[0], str)):
            raise PydanticCustomError(
                UNSUPPORTED, "the prompt must be one string (or a list of one string): token "
                "ids and several prompts are not supported by specchat serve")
        return data

    @model_validator(mode="after")
    def _served(self) -> "CompletionRequest":
        for name, what in _REFUSED.items():
            if getattr(self, name) not in _OFF:
                raise _refused(what)
        if self.echo:
            raise _refused("echoed prompts (echo: true)")
        if not self.text and not self.suffix:
            raise PydanticCustomError("too_short", "the prompt is empty (give a prompt, or a "
                                      "suffix to fill in before)")
        return self

    @property
    def text(self) -> str:
        """The prompt's text."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def exchange(self) -> ExchangeRequest:
        """The conversation layer's request: a raw text, no messages."""
        return ExchangeRequest(
            messages=(), temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.max_tokens, seed=self.seed, stop=self.stop_sequences,
            raw=RawText(self.text, self.suffix or ""))
