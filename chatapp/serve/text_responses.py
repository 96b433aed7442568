"""The objects ``POST /v1/completions`` answers with, shaped as OpenAI's text completions
(``"object": "text_completion"``, ``choices[].text``), with the same ``usage`` and ``specchat``
statistics as a chat completion (``chatapp.serve.responses``); and ``ReplyShape``, what the
routes need to answer in either shape."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatapp.api.exchange import ExchangeResult
from chatapp.chat.events import TokenSource
from chatapp.serve.responses import (
    ChunkMaker,
    completion,
    completion_id,
    finish_reason,
    speculation,
    sse,
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


class TextChunkMaker:
    """The chunks of one streamed text completion (one id, creation time and model): text
    chunks, the end chunk with the finish reason, the usage chunk if asked."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.ident = text_completion_id()
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data: dict[str, Any] = {"id": self.ident, "object": TEXT_COMPLETION,
                                "created": self.created, "model": self.model,
                                "system_fingerprint": None, "choices": choices}
        if self.include_usage:
            data["usage"] = None
        data.update(extra)
        return sse(data)

    def role(self) -> bytes:
        """Nothing: a text completion's stream opens with its first text."""
        return b""

    def content(self, pieces: Sequence[tuple[str, TokenSource]]) -> bytes:
        """Text, with where each token came from (as a chat chunk's ``specchat.tokens``)."""
        text = "".join(text for text, _ in pieces)
        return self._chunk([_choice(text)],
                           specchat={"tokens": [[t, s.value] for t, s in pieces]})

    def end(self, result: ExchangeResult) -> bytes:
        """The last chunk of the choice: its finish reason and the reply's statistics."""
        return self._chunk([_choice("", finish_reason(result))], specchat=speculation(result))

    def usage(self, result: ExchangeResult) -> bytes:
        """With ``stream_options.include_usage``: the usage chunk, no choices."""
        return self._chunk([], usage=usage(result))


def _choice(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


class Chunks(Protocol):
    """A streamed reply's chunks (``ChunkMaker``, ``TextChunkMaker``)."""

    def role(self) -> bytes: ...

    def content(self, pieces: Sequence[tuple[str, TokenSource]]) -> bytes: ...

    def end(self, result: ExchangeResult) -> bytes: ...

    def usage(self, result: ExchangeResult) -> bytes: ...


@dataclass(frozen=True)
class ReplyShape:
    """How an endpoint answers: ``whole`` (creation time, model, result -> the body),
    ``chunks`` (model, include_usage -> the stream's chunks), and ``prompt_param``: the
    parameter a prompt too long for the context is blamed on."""

    whole: Callable[[int, str, ExchangeResult], dict[str, Any]]
    chunks: Callable[[str, bool], Chunks]
    prompt_param: str


CHAT_SHAPE = ReplyShape(lambda created, model, result: completion(
    completion_id(), created, model, result), ChunkMaker, "messages")
TEXT_SHAPE = ReplyShape(lambda created, model, result: text_completion(
    text_completion_id(), created, model, result), TextChunkMaker, "prompt")
