"""The objects the API answers with, shaped as OpenAI's: a chat completion, its stream's chunks,
``usage``, the model list. specchat's own figures ride in a ``specchat`` field that standard
clients ignore (the official Python client keeps it as an extra attribute): the speculative
statistics of the reply, and on each streamed chunk where each token came from."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from chatapp.api.exchange import ExchangeResult
from chatapp.api.tool_calls import ArgumentsPart, CallStart, StreamItem, ToolReply
from chatapp.chat.events import TokenSource, decode_tokens_per_s

OWNER = "specchat"


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def usage(result: ExchangeResult) -> dict[str, Any]:
    """``usage`` as OpenAI reports it: the engine's token counts, and how much of the predicted
    output appears in the reply (``accepted_prediction_tokens``) or not (``rejected_...``)."""
    stats = result.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "completion_tokens_details": {
            "accepted_prediction_tokens": result.accepted_prediction,
            "rejected_prediction_tokens": result.rejected_prediction,
            "reasoning_tokens": 0,
            "audio_tokens": 0,
        },
    }


def speculation(result: ExchangeResult) -> dict[str, Any]:
    """The reply's speculative statistics (the ``specchat`` extension)."""
    stats = result.stats
    data: dict[str, Any] = {
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "target_calls": stats.target_calls,
        "tokens_per_target_call": round(stats.mean_accepted_length, 4),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "sources": {name: {"steps": c.steps, "drafted": c.drafted, "accepted": c.accepted}
                    for name, c in sorted(result.sources.items())},
        "prompt_s": round(stats.prompt_s, 6),
        "ttft_s": round(stats.ttft_s, 6),
        "total_s": round(stats.total_s, 6),
        "decode_tokens_per_s": round(decode_tokens_per_s(stats), 3),
        "finish_reason": result.finish_reason,
    }
    if result.not_saved:
        data["not_saved"] = result.not_saved
    if result.prediction_tokens is not None:
        data["prediction"] = {"tokens": result.prediction_tokens,
                              "used_as_draft_source": result.prediction_used}
    return data


def finish_reason(result: ExchangeResult, called: bool = False) -> str:
    """OpenAI's finish reason ("stop" or "length"; a reply cut short counts as "length";
    "tool_calls" for a reply that ``called`` a tool and ended by itself)."""
    if result.finish_reason != "stop":
        return "length"
    return "tool_calls" if called else "stop"


def completion(ident: str, created: int, model: str, result: ExchangeResult,
               reply: ToolReply | None = None) -> dict[str, Any]:
    """The whole answer of a request without ``stream``; ``reply``: the reply read for tool
    calls (None: the text is the reply)."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text, "refusal": None}
    if reply is not None and reply.calls:
        message["content"] = reply.content
        message["tool_calls"] = [_tool_call(call.id, call.name, call.arguments)
                                 for call in reply.calls]
    called = reply is not None and bool(reply.calls)
    return {
        "id": ident, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "finish_reason": finish_reason(result, called),
                     "logprobs": None, "message": message}],
        "usage": usage(result),
        "specchat": speculation(result),
    }


class ChunkMaker:
    """The chunks of one streamed reply (all with the same id, creation time and model). A
    subclass answers in another shape (``chatapp.serve.text_responses``): its ``kind``, id,
    first chunk and choices."""

    kind = "chat.completion.chunk"

    def __init__(self, model: str, include_usage: bool) -> None:
        self.ident = self.new_id()
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    @staticmethod
    def new_id() -> str:
        return completion_id()

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data: dict[str, Any] = {"id": self.ident, "object": self.kind,
                                "created": self.created, "model": self.model,
                                "system_fingerprint": None, "choices": choices}
        if self.include_usage:
            data["usage"] = None
        data.update(extra)
        return sse(data)

    def role(self) -> bytes:
        """The first chunk: the assistant's role, no text yet."""
        return self._chunk([_choice({"role": "assistant", "content": ""})])

    def content(self, pieces: Sequence[tuple[str, TokenSource]]) -> bytes:
        """Text, with where each token came from (accepted, resampled, bonus, target)."""
        text = "".join(text for text, _ in pieces)
        return self._chunk([self.text_choice(text)],
                           specchat={"tokens": [[t, s.value] for t, s in pieces]})

    def items(self, items: Sequence[StreamItem]) -> bytes:
        """A reply read for tool calls: its text and OpenAI's ``delta.tool_calls`` (a call's
        index, id, type and name when it starts, then its arguments in fragments)."""
        text = "".join(item for item in items if isinstance(item, str))
        calls: list[dict[str, Any]] = []
        for item in items:
            if isinstance(item, CallStart):
                calls.append({"index": item.index, **_tool_call(item.id, item.name, "")})
            elif isinstance(item, ArgumentsPart):
                calls.append({"index": item.index, "function": {"arguments": item.text}})
        delta: dict[str, Any] = {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = calls
        return self._chunk([_choice(delta)])

    def end(self, result: ExchangeResult, called: bool = False) -> bytes:
        """The last chunk of the choice: its finish reason and the reply's statistics."""
        return self._chunk([self.end_choice(finish_reason(result, called))],
                           specchat=speculation(result))

    def text_choice(self, text: str) -> dict[str, Any]:
        """The choice of a chunk with more ``text``."""
        return _choice({"content": text})

    def end_choice(self, finish: str) -> dict[str, Any]:
        """The choice of the last chunk, ending with ``finish``."""
        return _choice({}, finish)

    def usage(self, result: ExchangeResult) -> bytes:
        """With ``stream_options.include_usage``: the usage chunk, no choices."""
        return self._chunk([], usage=usage(result))


def _tool_call(ident: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"


DONE = b"data: [DONE]\n\n"


def model_object(ident: str, created: int, alias_of: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"id": ident, "object": "model", "created": created,
                            "owned_by": OWNER}
    if alias_of is not None:
        data["specchat"] = {"alias_of": alias_of}
    return data
