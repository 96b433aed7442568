"""The body of ``POST /v1/chat/completions`` as pydantic models, strict as JSON is in the values
it reads, lenient in the fields it does not know.

What is served: ``messages`` (system, developer = system, user, assistant with ``tool_calls``,
tool; text content as a string or as text parts), ``temperature``, ``top_p``, ``top_k`` and
``min_p`` (extensions), ``seed``, ``max_tokens`` / ``max_completion_tokens`` (null or -1: until
the context window ends), any number of ``stop`` strings, ``n`` = 1, ``stream`` with
``stream_options.include_usage``, ``prediction`` ``{"type": "content", "content": ...}``,
``tools`` (functions), ``tool_choice`` and ``parallel_tool_calls``, and ``response_format``
``text``, ``json_object`` (any JSON object) or ``json_schema`` (a JSON value its ``schema``
validates, enforced whether ``strict`` or not), which become the reply's grammar (a forced tool
call is one too: the two together are refused). Fields the OpenAI API defines that change
nothing here (``user``, ``metadata``, ``store``, ...) are accepted; the ones that would change
the reply in a way specchat cannot (images and audio, ``n`` > 1, log probabilities, penalties,
``logit_bias``, another response format, legacy ``functions``) are refused, each with its reason.
Any other field, of the body or of a message, is accepted and ignored, as clients differ in what
they send: ``ignored`` names them (``messages[0].cache_control``) for the response's
``x-specchat-ignored`` header and the debug log.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from chatapp.api.exchange import ChatMessage, ExchangeRequest, ReplyGrammar
from chatapp.api.tool_grammar import tool_call_grammar
from chatapp.chat.message import ToolCall
from chatapp.chat.session import UNTIL_CONTEXT_END
from chatapp.chat.tools import AUTO, NO_TOOLS, NONE, REQUIRED, FunctionTool, Tools
from chatapp.serve.errors import UNSUPPORTED
from chatapp.settings.options import MAX_SEED

PART_FEATURES = {"image_url": "images", "input_audio": "audio inputs", "file": "files"}


def _refuse(feature: str) -> PydanticCustomError:
    return PydanticCustomError(UNSUPPORTED, "{feature} are not supported by specchat serve "
                               "(text chat completions only)", {"feature": feature})


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
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


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: FunctionName
    arguments: str


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def tool_call(self) -> ToolCall:
        return ToolCall(self.id, self.function.name, self.function.arguments)


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = None  # accepted, not used (the chat templates have no place for it)
    refusal: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None  # accepted, not used (the templates answer calls in order)

    @model_validator(mode="before")
    @classmethod
    def _served(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("role") == "function":
                raise _refuse("function messages (the legacy form of tool messages)")
            if data.get("function_call") or data.get("audio"):
                raise _refuse("legacy function calls and audio replies")
            if data.get("role") != "assistant" and data.get("content") is None:
                raise PydanticCustomError("missing", "Field required")
        return data

    def chat_message(self) -> ChatMessage:
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        calls = tuple(call.tool_call() for call in self.tool_calls or ())
        return ChatMessage("system" if self.role == "developer" else self.role, text, calls)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
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


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the grammar of a forced call follows the schema either way


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: FunctionSpec

    def function_tool(self) -> FunctionTool:
        spec = self.function
        if spec.parameters is None:
            return FunctionTool(spec.name, spec.description)
        return FunctionTool(spec.name, spec.description, spec.parameters)


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: NamedFunction


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


def _reply_limit(value: int | None) -> int | None:
    """A reply's limit in tokens: at least 1, or -1 (until the context window ends)."""
    if value is not None and value < 1 and value != -1:
        raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal "
                                  "to 1 (or -1: until the context window ends)")
    return value


# Fields that would change the reply in a way specchat cannot: refused when set to anything but
# their "off" value, with what to say.
_REFUSED = {
    "functions": "legacy functions (send tools)",
    "function_call": "functions", "logprobs": "log probabilities",
    "top_logprobs": "log probabilities", "logit_bias": "logit biases",
    "frequency_penalty": "frequency penalties", "presence_penalty": "presence penalties",
    "audio": "audio replies", "modalities": "other modalities than text",
    "web_search_options": "web searches",
}
_OFF: tuple[Any, ...] = (None, False, 0, 0.0, [], {}, "none", ["text"])


class StreamedRequest(BaseModel):
    """What both completion endpoints share: ``stream`` with its options, ``stop`` (any number
    of strings), and leniency: a field not read is accepted and named in ``ignored``."""

    model_config = ConfigDict(extra="allow", strict=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def ignored(self) -> list[str]:
        """The fields of the body that are not read, by their names."""
        return list(self.model_extra or ())

    @property
    def tool_set(self) -> Tools:
        """The functions the reply may call (none unless the endpoint takes tools)."""
        return NO_TOOLS


class ChatCompletionRequest(StreamedRequest):
    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    max_tokens: Annotated[int | None, AfterValidator(_reply_limit)] = None
    max_completion_tokens: Annotated[int | None, AfterValidator(_reply_limit)] = None
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
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # Refused unless off (see _REFUSED).
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
        names = [tool.function.name for tool in self.tools or ()]
        if len(set(names)) < len(names):
            raise PydanticCustomError("value_error", "two tools have the same name")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise PydanticCustomError("value_error", "tool_choice names a function that is not "
                                      "among the tools: {name}", {"name": choice.function.name})
        if choice == REQUIRED and not names:
            raise PydanticCustomError("value_error", "tool_choice 'required' needs tools")
        if self.tool_set.forced and self._format_grammar() is not None:
            raise PydanticCustomError(UNSUPPORTED, "a forced tool call (tool_choice) and a JSON "
                                      "response_format cannot both shape one reply: send one")
        return self

    @property
    def ignored(self) -> list[str]:
        """The fields of the body and of its messages that are not read, by their names."""
        names = super().ignored
        for i, message in enumerate(self.messages):
            names += [f"messages[{i}].{name}" for name in message.model_extra or ()]
        return names

    @property
    def tool_set(self) -> Tools:
        """The declared functions and the choice among them ("auto" when there are tools)."""
        declared = tuple(tool.function_tool() for tool in self.tools or ())
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
        else:
            name = choice or (AUTO if declared else NONE)
        return Tools(declared, name, self.parallel_tool_calls is not False)

    def exchange(self) -> ExchangeRequest:
        """The conversation layer's request."""
        tools = self.tool_set
        return ExchangeRequest(
            messages=tuple(message.chat_message() for message in self.messages),
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self._max_tokens, seed=self.seed, stop=self.stop_sequences,
            prediction=self.prediction.text if self.prediction else None,
            grammar=self._grammar(tools), tools=tools, min_p=self.min_p)

    @property
    def _max_tokens(self) -> int | None:
        """The reply's limit: the request's, ``UNTIL_CONTEXT_END`` for an explicit null or -1,
        None (the server's setting) when it sets none."""
        for name in ("max_completion_tokens", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value != -1:
                return int(value)
        sent = {"max_completion_tokens", "max_tokens"} & self.model_fields_set
        return UNTIL_CONTEXT_END if sent else None

    def _grammar(self, tools: Tools) -> ReplyGrammar | None:
        """The grammar the reply must match: a forced tool call's, a JSON response format's
        (never both: refused), else None."""
        return self._format_grammar() or tool_call_grammar(tools)

    def _format_grammar(self) -> ReplyGrammar | None:
        """The grammar of the response format (None: plain text)."""
        return self.response_format.grammar() if self.response_format is not None else None
