"""Connections to `specchat serve`: how many, how long one may take to ask, and how a request
aiohttp cannot parse is answered.

aiohttp keeps a connection that has not finished sending its request head for as long as its
keep-alive allows (an hour), and accepts any number of them. ``Connections`` wraps the server's
protocol factory: past ``max_open`` open connections a new one is closed at once, and a connection
whose first request head has not arrived ``head_timeout_s`` after it opened is closed (the guard
marks each request it sees with ``seen``). Later requests on a kept-alive connection are bounded
by aiohttp's ``keepalive_timeout`` (``KEEPALIVE_S``), and request bodies by the handler's own
timeout. A request aiohttp's parser refuses before any handler runs (a malformed request line or
header, a line too long) is answered in OpenAI's error shape too (``_JsonErrors``), as every other
refusal is.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from chatapp.serve.errors import INVALID_REQUEST, ApiError

MAX_CONNECTIONS = 64
HEAD_TIMEOUT_S = 10.0  # from the connection to its first request's head
KEEPALIVE_S = 10.0  # an idle (or half-sent) next request on a kept-alive connection


class Connections:
    """The open connections of one server; see the module docstring."""

    def __init__(self, max_open: int | None = None, head_timeout_s: float | None = None
                 ) -> None:
        """None: the module's ``MAX_CONNECTIONS``, ``HEAD_TIMEOUT_S`` (read now)."""
        self.max_open = MAX_CONNECTIONS if max_open is None else max_open
        self.head_timeout_s = HEAD_TIMEOUT_S if head_timeout_s is None else head_timeout_s
        self.keepalive_s = KEEPALIVE_S  # aiohttp's keepalive_timeout for this server
        self.open = 0
        self._seen: set[asyncio.BaseTransport] = set()

    def seen(self, transport: asyncio.BaseTransport | None) -> None:
        """A request head arrived on ``transport``."""
        if transport is not None:
            self._seen.add(transport)

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """``inner`` (aiohttp's protocol factory) with the limits, its parser's refusals in
        OpenAI's shape."""
        return lambda: _Limited(_json_errors(inner()), self)

    def opened(self, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection; False (and it is closed) past the limit."""
        if self.open >= self.max_open:
            transport.abort()
            return False
        self.open += 1
        return True

    def closed(self, transport: asyncio.BaseTransport) -> None:
        self.open -= 1
        self._seen.discard(transport)

    def expire(self, transport: asyncio.BaseTransport) -> None:
        """``head_timeout_s`` after it opened: close ``transport`` unless a head came."""
        if transport not in self._seen:
            transport.abort()


class _Limited(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted, with a deadline for its first head."""

    def __init__(self, inner: asyncio.Protocol, connections: Connections) -> None:
        self._inner = inner
        self._connections = connections
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._connections.opened(transport):
            return
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(
            self._connections.head_timeout_s, self._connections.expire, transport)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return  # refused: the inner protocol never saw it
        if self._timer is not None:
            self._timer.cancel()
        self._connections.closed(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class LimitedSite(web.SockSite):
    """``web.SockSite`` whose connections go through ``connections``."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket,
                 connections: Connections, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self._connections = connections

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._connections.factory(server), sock=self._sock)


class _JsonErrors(RequestHandler):
    """aiohttp's protocol for one connection, answering what its parser refuses as OpenAI's JSON
    error (aiohttp's own answer is plain text). Nothing else differs: it is aiohttp's handler
    with this one method, set on the instance aiohttp made (``_json_errors``)."""

    __slots__ = ()

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs and checks, as aiohttp does
        if status >= 500:
            refusal = ApiError(status, "specchat serve failed on this request (a bug): its log "
                               "says more.", type="server_error", code="server_error")
        else:
            reason = message.splitlines()[0][:200] if message else "malformed request"
            refusal = ApiError(status, f"The request could not be read as HTTP: {reason}.",
                               INVALID_REQUEST, code="bad_request")
        answer = refusal.response()
        answer.force_close()
        return answer


def _json_errors(protocol: asyncio.Protocol) -> asyncio.Protocol:
    """``protocol`` (aiohttp's ``RequestHandler``) answering its parser's refusals as JSON."""
    if type(protocol) is RequestHandler:
        protocol.__class__ = _JsonErrors
    return protocol
