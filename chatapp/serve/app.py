"""The routes of `specchat serve`, on aiohttp:

- ``GET /v1/models`` (and ``/v1/models/{id}``): the loaded pair as one model id, then its aliases
  (the names ``--served-model-name`` adds among them);
- ``POST /v1/chat/completions``: a reply, whole or streamed as server-sent events, under
  whatever model name the request gives (one pair is loaded: every name is served by it, and
  the answer carries the name asked for); with tools, the reply's calls as OpenAI's
  ``tool_calls`` (``chatapp.api.tool_calls``); the fields it ignored named in the
  ``x-specchat-ignored`` header;
- ``POST /v1/completions``: a raw text completion, with a ``suffix`` a fill-in-the-middle one,
  on the same pipeline (``chatapp.chat.prompt.RawText``), answered in OpenAI's text shape;
- ``GET /health``: 200 ``{"status": "ok", "model": ...}`` once the models are loaded, 503
  ``{"status": "loading"}`` before (the server listens while they load; chat requests get 503
  ``loading`` then);
- ``GET /metrics``: Prometheus' text format.

Every request first passes the guard (``chatapp.serve.guard``); every refusal is OpenAI-shaped
(``chatapp.serve.errors``). A reply is an exchange of the conversation layer
(``chatapp.api.exchange``), run by the worker (``chatapp.serve.worker``) one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web
from pydantic import ValidationError

from chatapp.api.exchange import (
    ChatExchange,
    ExchangeDone,
    ExchangeEvent,
    ExchangeResult,
    ExchangeStarted,
    FimUnsupportedError,
    GrammarError,
    PredictionTooLongError,
    PromptCancelled,
    PromptTooLongError,
    ReplyDelta,
)
from chatapp.api.tool_calls import StreamItem, ToolCallStream, parse_reply
from chatapp.errors import RequestRefused, UserFacingError
from chatapp.serve.completion_schema import CompletionRequest
from chatapp.serve.connections import Connections
from chatapp.serve.errors import ApiError, from_validation, not_found, server_error
from chatapp.serve.guard import Guard
from chatapp.serve.metrics import CONTENT_TYPE, ServeMetrics
from chatapp.serve.responses import DONE, model_object, sse
from chatapp.serve.schemas import ChatCompletionRequest
from chatapp.serve.text_responses import CHAT_SHAPE, TEXT_SHAPE, Chunks, ReplyShape
from chatapp.serve.worker import Closing, EngineWorker, JobStream, QueueFull

MAX_BODY = 16 * 1024 * 1024  # a request with a long conversation and a prediction
BODY_TIMEOUT_S = 30.0  # how long a request body may take to arrive
LARGE_BODY = 1024 * 1024  # larger bodies are read a few at a time
INTERNAL_ERROR = "specchat serve failed on this request (a bug): its log says more."
log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)


class ApiServer:
    """The routes over one loaded ``exchange`` (None while it loads: ``loaded`` gives it);
    ``models``: the model id, then its aliases."""

    def __init__(self, exchange: ChatExchange | None, worker: EngineWorker, guard: Guard,
                 models: Sequence[str], connections: Connections | None = None) -> None:
        self.exchange = exchange
        self.connections = connections or Connections()
        self.worker = worker
        self.guard = guard
        self.models = tuple(models)
        self.created = int(time.time())
        self.metrics = ServeMetrics(lambda: worker.waiting, lambda: float(worker.busy))
        self._reading = 0  # large request bodies being read

    def loaded(self, exchange: ChatExchange) -> None:
        """The models are loaded: answer with ``exchange`` from now on."""
        self.exchange = exchange

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._guarded], client_max_size=MAX_BODY)
        app.add_routes([
            web.get("/v1/models", self._list_models),
            web.get("/v1/models/{model:.+}", self._get_model),
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completions),
            web.get("/health", self._health),
            web.get("/metrics", self._metrics),
        ])
        return app

    @web.middleware
    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The guard's checks, CORS, and every error as OpenAI's JSON."""
        self.connections.seen(request.transport)
        origin = request.headers.get("Origin")
        try:
            self.guard.check(request.method, request.headers)
            if request.method == "OPTIONS":
                response: web.StreamResponse = web.Response(status=204)
            else:
                response = await handler(request)
        except ApiError as error:
            response = error.response()
        except web.HTTPException as error:
            response = _http_error(error)
        except UserFacingError as error:  # the models failed: say what to do
            response = server_error(f"The reply failed: {error}").response()
        except Exception:  # noqa: BLE001 (a bug: logged once, answered without internals)
            log.exception("specchat serve: %s %s failed", request.method, request.path)
            response = server_error(INTERNAL_ERROR).response()
        if not response.prepared:
            response.headers.update(self.guard.cors_headers(origin))
        self.metrics.answered(request.path if request.path in _ENDPOINTS else "other",
                              response.status)
        return response

    async def _list_models(self, request: web.Request) -> web.Response:
        primary = self.models[0]
        data = [model_object(primary, self.created)] + [
            model_object(alias, self.created, primary) for alias in self.models[1:]]
        return web.json_response({"object": "list", "data": data})

    async def _get_model(self, request: web.Request) -> web.Response:
        ident = request.match_info["model"]
        if ident not in self.models:
            raise _unknown_model(ident)
        alias_of = self.models[0] if ident != self.models[0] else None
        return web.json_response(model_object(ident, self.created, alias_of))

    async def _health(self, request: web.Request) -> web.Response:
        if self.exchange is None:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok", "model": self.models[0]})

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_body(request, ChatCompletionRequest)
        return await self._answer(request, body, CHAT_SHAPE)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_body(request, CompletionRequest)
        return await self._answer(request, body, TEXT_SHAPE)

    async def _answer(self, request: web.Request, body: Body,
                      shape: ReplyShape) -> web.StreamResponse:
        """The reply to a validated ``body``, whole or streamed, in ``shape``, under the model
        name the request gave; the fields it ignored named in a header."""
        exchange = self.exchange
        if exchange is None:
            raise server_error("specchat serve is loading its models: retry in a moment.",
                               "loading", 503)
        ignored = _ignored_header(body)
        exchange_request = body.exchange()
        try:
            async with self.worker.job(
                    lambda cancel: exchange.run(exchange_request, cancel)) as job:
                pending = await _started(job)
                if body.stream:
                    return await self._stream(request, body, job, pending, shape, ignored)
                response = await self._whole(body, job, pending, shape)
                response.headers.update(ignored)
                return response
        except QueueFull as full:
            raise _queue_full(full.retry_after) from None
        except (Closing, PromptCancelled):
            raise server_error("specchat serve is stopping.", "server_stopping", 503) from None
        except PromptTooLongError as error:
            raise ApiError(400, str(error), code="context_length_exceeded",
                           param=shape.prompt_param) from None
        except FimUnsupportedError as error:
            raise ApiError(400, str(error), code="unsupported_value", param="suffix") from None
        except PredictionTooLongError as error:
            raise ApiError(400, str(error), code="context_length_exceeded",
                           param="prediction") from None
        except GrammarError as error:
            raise ApiError(400, str(error), code="invalid_grammar") from None
        except RequestRefused as error:
            raise ApiError(400, str(error), code="unsupported_value", param="tools") from None

    async def _read_body(self, request: web.Request, schema: type[Body]) -> Body:
        """The request's body, validated. A large one (over ``LARGE_BODY``, or of unknown
        length) is read only while fewer large ones are being read than the worker could take
        (one running, the queue): else 429 at once, so that memory stays bounded. A body that
        takes more than ``BODY_TIMEOUT_S`` to arrive gets 408."""
        length = request.content_length
        large = length is None or length > LARGE_BODY
        if large and self._reading > self.worker.max_waiting:
            raise _queue_full(self.worker.retry_after())
        self._reading += large
        try:
            data = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
            return schema.model_validate_json(data)
        except TimeoutError:
            raise ApiError(408, f"The request body did not arrive within {BODY_TIMEOUT_S:g} s.",
                           code="request_timeout") from None
        except ValidationError as error:
            raise from_validation(error) from None
        finally:
            self._reading -= large

    async def _whole(self, body: Body, job: JobStream[ExchangeEvent],
                     pending: list[ExchangeEvent], shape: ReplyShape) -> web.Response:
        """A reply without ``stream``: all of it at once (read for tool calls when the request
        has tools)."""
        result = _not_cut_short(await _result(job, pending))
        self.metrics.reply(result)
        tools = body.tool_set
        reply = parse_reply(result.text, tools) if tools.callable else None
        return web.json_response(shape.whole(int(time.time()), body.model, result, reply))

    async def _stream(self, request: web.Request, body: Body,
                      job: JobStream[ExchangeEvent], pending: list[ExchangeEvent],
                      shape: ReplyShape, ignored: dict[str, str]) -> web.StreamResponse:
        """A streamed reply: a role chunk, text chunks as tokens come (with their sources), the
        end chunk, the usage chunk if asked, ``[DONE]``. A failure once the stream has started
        is its last event (an OpenAI error object), without ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache", **ignored})
        response.headers.update(self.guard.cors_headers(request.headers.get("Origin")))
        await response.prepare(request)
        chunks = shape.chunks(body.model, body.include_usage)
        calls = ToolCallStream(body.tool_set)
        try:
            await response.write(chunks.role())
            result = _not_cut_short(await _stream_text(response, chunks, calls, job, pending))
            self.metrics.reply(result)
            await _write_items(response, chunks, calls.finish())
            await response.write(chunks.end(result, bool(calls.calls)))
            if body.include_usage:
                await response.write(chunks.usage(result))
            await response.write(DONE)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: leaving the job block cancels the reply
        except ApiError as error:
            await response.write(sse(error.body()))
        except UserFacingError as error:  # the models failed mid-reply: say what to do
            await response.write(sse(server_error(f"The reply failed: {error}").body()))
        except Exception:  # noqa: BLE001 (a bug: logged once, told without internals)
            log.exception("specchat serve: a streamed reply failed")
            await response.write(sse(server_error(INTERNAL_ERROR).body()))
        return response


_ENDPOINTS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics")
IGNORED_HEADER = "x-specchat-ignored"


def _ignored_header(body: Body) -> dict[str, str]:
    """The header that names the fields the request sent and the server ignored (none: {});
    logged at debug level."""
    ignored = body.ignored
    if not ignored:
        return {}
    log.debug("specchat serve: ignored request fields: %s", ", ".join(ignored))
    return {IGNORED_HEADER: ", ".join(ignored)}


def _not_cut_short(result: ExchangeResult) -> ExchangeResult:
    """``result``, unless the server's stopping cut the reply short (then a 503)."""
    if result.finish_reason == "cancelled":
        raise server_error("specchat serve is stopping: the reply was cut short.",
                           "server_stopping", 503)
    return result


async def _started(job: JobStream[ExchangeEvent]) -> list[ExchangeEvent]:
    """Wait until the exchange has planned its prompt (or refused it: that raises); the events
    that came with it."""
    while True:
        events = await job.next()
        if any(isinstance(event, ExchangeStarted) for event in events) or job.finished:
            return events


async def _result(job: JobStream[ExchangeEvent], events: list[ExchangeEvent]
                  ) -> ExchangeResult:
    while True:
        for event in events:
            if isinstance(event, ExchangeDone):
                await job.turn_over()
                return event.result
        if job.finished:
            raise server_error("The reply ended without its result.")
        events = await job.next()


async def _stream_text(response: web.StreamResponse, chunks: Chunks, calls: ToolCallStream,
                       job: JobStream[ExchangeEvent], events: list[ExchangeEvent]
                       ) -> ExchangeResult:
    """Write the reply's text as its events come, from ``events`` on (read for ``calls`` when
    they are active); its result."""
    while True:
        result = await _write_events(response, chunks, calls, events)
        if result is not None:
            await job.turn_over()
            return result
        events = await job.next()
        if not events and job.finished:
            raise server_error("The reply ended without its result.")


async def _write_events(response: web.StreamResponse, chunks: Chunks,
                        calls: ToolCallStream, events: list[ExchangeEvent]
                        ) -> ExchangeResult | None:
    """Write the text of ``events`` as one chunk; the result if they hold the end."""
    pieces: list[Any] = []
    result = None
    for event in events:
        if isinstance(event, ReplyDelta):
            pieces.extend(event.pieces)
        elif isinstance(event, ExchangeDone):
            result = event.result
    if pieces and calls.active:
        await _write_items(response, chunks, calls.push("".join(text for text, _ in pieces)))
    elif pieces:
        await response.write(chunks.content(pieces))
    return result


async def _write_items(response: web.StreamResponse, chunks: Chunks,
                       items: list[StreamItem]) -> None:
    if items:
        await response.write(chunks.items(items))


def _queue_full(retry_after: int) -> ApiError:
    return ApiError(429, "specchat serve makes one reply at a time and its queue is full: retry "
                    f"in {retry_after} s.", type="rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(retry_after)})


def _unknown_model(ident: str) -> ApiError:
    error = not_found(f"The model '{ident}' does not exist here: GET /v1/models lists the one "
                      "this server runs (and its aliases).")
    error.code, error.param = "model_not_found", "model"
    return error


def _http_error(error: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no such route, wrong method, body too large) as OpenAI's."""
    messages = {404: "There is no such endpoint here: see /v1/models and "
                     "/v1/chat/completions.",
                405: "That method is not allowed on this endpoint.",
                413: f"The request body is larger than {MAX_BODY // (1024 * 1024)} MiB."}
    message = messages.get(error.status, error.reason)
    refusal = ApiError(error.status, message, code=error.reason.lower().replace(" ", "_"))
    if error.status == 405:
        refusal.headers["Allow"] = error.headers.get("Allow", "")
    return refusal.response()
