"""The body of ``POST /v1/chat/completions`` as pydantic models, strict as JSON is.

What is served: ``messages`` (system, developer = system, user, assistant; text content as a
string or as text parts), ``temperature``, ``top_p``, ``top_k`` (an extension), ``seed``,
``max_tokens`` / ``max_completion_tokens``, ``stop``, ``n`` = 1, ``stream`` with
``stream_options.include_usage``, ``prediction`` ``{"type": "content", "content": ...}``, and
``response_format`` ``text``, ``json_object`` (any JSON object) or ``json_schema`` (a JSON value
its ``schema`` validates, enforced whether ``strict`` or not), which become the reply's grammar.
Fields the OpenAI API defines that change nothing here (``user``, ``metadata``, ``store``, ...)
are accepted; the ones that would change the reply in a way specchat cannot (tools, images and
audio, ``n`` > 1, log probabilities, penalties, ``logit_bias``, another response format) are
refused, each with its reason; any other field is refused as unknown, as OpenAI does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from chatapp.api.exchange import ChatMessage, ExchangeRequest, ReplyGrammar
from chatapp.serve.errors import UNSUPPORTED
from chatapp.settings.options import MAX_SEED

MAX_STOPS = 4
PART_FEATURES = {"image_url": "images", "input_audio": "audio inputs", "file": "files"}


def _refuse(feature: str) -> PydanticCustomError:
    return PydanticCustomError(UNSUPPORTED, "{feature} are not supported by specchat serve "
                               "(text chat completions only)", {"feature": feature})


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


def _text_parts_only(value: Any) -> Any:
    """Parts of another type than text are refused by name (images, audio, files)."""
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise _refuse(PART_FEATURES.get(kind, f"content parts of type '{kind}'"))
    return value


Content = Annotated[str | list[TextPart], BeforeValidator(_text_parts_only)]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: Content | None = None
    name: str | None = None  # accepted, not used (the chat templates have no place for it)
    refusal: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_tools(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("role") in ("tool", "function"):
                raise _refuse("tool and function messages")
            if data.get("tool_calls") or data.get("function_call") or data.get("audio"):
                raise _refuse("tool calls and audio replies")
            if data.get("role") != "assistant" and data.get("content") is None:
                raise PydanticCustomError("missing", "Field required")
        return data

    def chat_message(self) -> ChatMessage:
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        return ChatMessage("system" if self.role == "developer" else self.role, text)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted, not used


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["content"]
    content: Annotated[str | list[TextPart], BeforeValidator(_text_parts_only)]

    @property
    def text(self) -> str:
        content = self.content
        return content if isinstance(content, str) else "".join(p.text for p in content)


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's structured outputs."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the schema is enforced either way


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _served(self) -> "ResponseFormat":
        if self.type not in ("text", "json_object", "json_schema"):
            raise _refuse(f"response formats of type '{self.type}'")
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError("missing", "Field required: json_schema")
        return self

    def grammar(self) -> ReplyGrammar | None:
        """The grammar the reply must match (None: plain text)."""
        if self.type == "json_object":
            return ReplyGrammar.json_schema({"type": "object"}, "response_format json_object")
        if self.type == "json_schema" and self.json_schema is not None:
            return ReplyGrammar.json_schema(
                self.json_schema.json_schema,
                f"response_format json_schema '{self.json_schema.name}'")
        return None


# Fields that would change the reply in a way specchat cannot: refused when set to anything but
# their "off" value, with what to say.
_REFUSED = {
    "tools": "tools", "tool_choice": "tools", "functions": "functions",
    "function_call": "functions", "logprobs": "log probabilities",
    "top_logprobs": "log probabilities", "logit_bias": "logit biases",
    "frequency_penalty": "frequency penalties", "presence_penalty": "presence penalties",
    "audio": "audio replies", "modalities": "other modalities than text",
    "web_search_options": "web searches",
}
_OFF: tuple[Any, ...] = (None, False, 0, 0.0, [], {}, "none", ["text"])


class StreamedRequest(BaseModel):
    """What both completion endpoints share: ``stream`` with its options, ``stop``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None

    @model_validator(mode="after")
    def _few_stops(self) -> "StreamedRequest":
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            raise PydanticCustomError("too_long", "at most {max} stop sequences",
                                      {"max": MAX_STOPS})
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatCompletionRequest(StreamedRequest):
    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    prediction: Prediction | None = None
    response_format: ResponseFormat | None = None
    # Accepted, and nothing to do with them here.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Refused unless off (see _REFUSED).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    audio: Any = None
    modalities: list[str] | None = None
    web_search_options: Any = None

    @model_validator(mode="after")
    def _served(self) -> "ChatCompletionRequest":
        for name, feature in _REFUSED.items():
            if getattr(self, name) not in _OFF:
                raise _refuse(feature)
        if self.n is not None and self.n > 1:
            raise PydanticCustomError(UNSUPPORTED, "n > 1 is not supported by specchat serve: "
                                      "it makes one reply at a time (send n requests)")
        return self

    def exchange(self) -> ExchangeRequest:
        """The conversation layer's request."""
        return ExchangeRequest(
            messages=tuple(message.chat_message() for message in self.messages),
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.max_completion_tokens or self.max_tokens, seed=self.seed,
            stop=self.stop_sequences,
            prediction=self.prediction.text if self.prediction else None,
            grammar=self.response_format.grammar() if self.response_format else None)
