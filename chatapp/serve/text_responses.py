"""The objects ``POST /v1/completions`` answers with, shaped as OpenAI's text completions
(``"object": "text_completion"``, ``choices[].text``), with the same ``usage`` and ``specchat``
statistics as a chat completion (``chatapp.serve.responses``); and ``ReplyShape``, what the
routes need to answer in either shape."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatapp.api.exchange import ExchangeResult
from chatapp.api.tool_calls import StreamItem, ToolReply
from chatapp.chat.events import TokenSource
from chatapp.serve.responses import (
    ChunkMaker,
    completion,
    completion_id,
    finish_reason,
    speculation,
    usage,
)

TEXT_COMPLETION = "text_completion"


def text_completion_id() -> str:
    return f"cmpl-{secrets.token_hex(12)}"


def text_completion(ident: str, created: int, model: str, result: ExchangeResult
                    ) -> dict[str, Any]:
    """The whole answer of a completion request without ``stream``."""
    return {
        "id": ident, "object": TEXT_COMPLETION, "created": created, "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "text": result.text, "logprobs": None,
                     "finish_reason": finish_reason(result)}],
        "usage": usage(result),
        "specchat": speculation(result),
    }


class TextChunkMaker(ChunkMaker):
    """The chunks of one streamed text completion: text chunks, the end chunk with the finish
    reason, the usage chunk if asked (no first chunk: the stream opens with its first text)."""

    kind = TEXT_COMPLETION

    @staticmethod
    def new_id() -> str:
        return text_completion_id()

    def role(self) -> bytes:
        """Nothing: a text completion's stream opens with its first text."""
        return b""

    def text_choice(self, text: str) -> dict[str, Any]:
        return _choice(text)

    def end_choice(self, finish: str) -> dict[str, Any]:
        return _choice("", finish)


def _choice(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


class Chunks(Protocol):
    """A streamed reply's chunks (``ChunkMaker``, ``TextChunkMaker``)."""

    def role(self) -> bytes: ...

    def content(self, pieces: Sequence[tuple[str, TokenSource]]) -> bytes: ...

    def items(self, items: Sequence[StreamItem]) -> bytes: ...

    def end(self, result: ExchangeResult, called: bool = False) -> bytes: ...

    def usage(self, result: ExchangeResult) -> bytes: ...


@dataclass(frozen=True)
class ReplyShape:
    """How an endpoint answers: ``whole`` (creation time, model, result, the reply read for
    tool calls or None -> the body),
    ``chunks`` (model, include_usage -> the stream's chunks), and ``prompt_param``: the
    parameter a prompt too long for the context is blamed on."""

    whole: Callable[[int, str, ExchangeResult, ToolReply | None], dict[str, Any]]
    chunks: Callable[[str, bool], Chunks]
    prompt_param: str


CHAT_SHAPE = ReplyShape(lambda created, model, result, reply: completion(
    completion_id(), created, model, result, reply), ChunkMaker, "messages")
TEXT_SHAPE = ReplyShape(lambda created, model, result, reply: text_completion(
    text_completion_id(), created, model, result), TextChunkMaker, "prompt")
