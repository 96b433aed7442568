"""The measurement tools' client of `specchat serve`: chat completions over plain HTTP with the
standard library (as any other client talks to the server), whole or streamed, and the error
messages a tool prints when a server refuses or does not answer.

Every request is greedy (temperature 0, seed 0). A streamed reply is timed on the client's side:
the time from sending the request to the first chunk with text, and the rate at which the tokens
after that chunk arrived (counted from the per-token provenance the server puts on each chunk).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 600.0
Message = dict[str, str]


def request_body(messages: Sequence[Message], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy chat-completion request (temperature 0, seed 0) for ``messages``."""
    return {"model": "specchat", "max_tokens": max_tokens, "temperature": 0, "seed": 0,
            "messages": list(messages), **extra}


def _open(base_url: str, body: dict[str, Any], api_key: str | None) -> Any:
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {api_key or 'unused'}"})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)


def post_completion(base_url: str, body: dict[str, Any],
                    api_key: str | None = None) -> dict[str, Any]:
    """The whole answer to ``body`` from the server at ``base_url`` (".../v1")."""
    with _open(base_url, body, api_key) as response:
        return json.loads(response.read())


@dataclass(frozen=True)
class Streamed:
    """A streamed reply: its text and tokens, the server's figures (the last chunk's
    ``specchat`` field) and ``usage``, and the client's timings (seconds; the rate in tokens per
    second, 0 when a single chunk carried every token)."""

    text: str
    tokens: int
    figures: dict[str, Any]
    usage: dict[str, Any]
    client_ttft_s: float
    client_tokens_per_s: float


def stream_completion(base_url: str, body: dict[str, Any],
                      api_key: str | None = None) -> Streamed:
    """``body`` sent with ``stream`` (and the usage chunk), read to ``[DONE]`` and timed (see
    the module docstring)."""
    started = time.perf_counter()
    texts: list[str] = []
    first_at = last_at = 0.0
    first_tokens = tokens = 0
    figures: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with _open(base_url, body, api_key) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            extension = chunk.get("specchat") or {}
            if delta.get("content"):
                now = time.perf_counter()
                count = len(extension.get("tokens", ())) or 1
                if not texts:
                    first_at, first_tokens = now, count
                last_at, tokens = now, tokens + count
                texts.append(delta["content"])
            elif "decode_tokens_per_s" in extension:
                figures = extension
            usage = chunk.get("usage") or usage
    after_first = last_at - first_at
    rate = (tokens - first_tokens) / after_first if after_first > 0 else 0.0
    ttft = first_at - started if texts else 0.0
    return Streamed("".join(texts), tokens, figures, usage, ttft, rate)


def guarded(prog: str, action: Callable[[], object]) -> int:
    """Run a tool's ``action``; 0, or 1 or 2 with a message on stderr that says what went wrong
    (bad arguments, a refused request, a server that did not answer)."""
    try:
        action()
    except ValueError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except urllib.error.HTTPError as error:
        print(f"{prog}: the server refused a request ({error.code}): "
              f"{error.read().decode('utf-8', 'replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"{prog}: the server did not answer: {error}", file=sys.stderr)
        return 1
    return 0
