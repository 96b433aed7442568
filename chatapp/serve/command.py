"""`specchat serve`: load the models, listen, answer until Ctrl+C or SIGTERM, then stop cleanly.

Stopping: new requests are refused (503), the waiting ones are answered with an error, the reply
being made stops after its step, or its prompt's tokenization stops (its client gets an error:
the reply was cut short), the models are closed, and the command exits with status 0. Whatever
it is doing, it exits within ``STOP_DEADLINE_S`` of the signal (status 1 when it had to cut
short a step or a load that cannot be interrupted).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from chatapp.api.exchange import ChatExchange, SessionFactory, open_exchange
from chatapp.serve.app import ApiServer
from chatapp.serve.connections import Connections, LimitedSite
from chatapp.serve.guard import API_KEY_ENV, Guard, UnsafeAddress, bind_address, check_exposure
from chatapp.serve.worker import EngineWorker
from chatapp.settings.config import Config

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_GRACE_S = 2.0  # how long open connections have to finish once the replies stopped
STOP_DEADLINE_S = 4.5  # from the stop signal to the exit, whatever the server is doing


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    queue: int = 4  # requests that may wait while one is generated
    save: bool = False  # write the exchanges to the chat history
    served_names: tuple[str, ...] = ()  # more names /v1/models lists (--served-model-name)


def model_ids(config: Config, served_names: tuple[str, ...] = ()) -> list[str]:
    """The loaded pair as one model id ("qwen2.5-coder-1.5b+qwen2.5-coder-0.5b"), then its
    aliases: "specchat", the target's name and ``served_names``."""
    target = _name(config.target)
    if config.draft_length == "0":
        primary = target
    elif config.drafter == "ngram":
        primary = f"{target}+ngram"
    else:
        primary = f"{target}+{_name(config.draft)}"
    return list(dict.fromkeys([primary, "specchat", target, *served_names]))


def _name(model: str) -> str:
    """A catalog alias as it is; a model file by its name without the suffix."""
    path = Path(model)
    return path.stem if path.suffix == ".gguf" or os.sep in model else model


def _progress(message: str, fraction: float | None) -> None:
    if message and sys.stderr.isatty():
        percent = f" {fraction:.0%}" if fraction is not None else ""
        print(f"\r\033[K{message}{percent}", end="", file=sys.stderr, flush=True)


def _listen(host: str, port: int) -> socket.socket:
    address = bind_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve_command(config: Config, options: ServeOptions,
                  factory: SessionFactory | None = None) -> int:
    """`specchat serve` until Ctrl+C or SIGTERM; the exit status."""
    api_key = options.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        check_exposure(options.host, api_key)
        sock = _listen(options.host, options.port)
    except UnsafeAddress as error:
        print(f"specchat serve: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"specchat serve: cannot listen on {options.host}:{options.port}: {error}",
              file=sys.stderr)
        return 1
    try:
        return asyncio.run(_serve(config, options, api_key, sock, factory))
    finally:
        sock.close()


def _exit_by(deadline_s: float) -> None:
    """End the process ``deadline_s`` from now if it is still running then (loading the models,
    or in a step that cannot be interrupted): the exit status is 1, the models are not closed."""
    def force() -> None:
        print(f"specchat serve: not stopped within {deadline_s:g} s (the models were busy); "
              "exiting without closing them", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(deadline_s, force)
    timer.daemon = True
    timer.start()


async def _serve(config: Config, options: ServeOptions, api_key: str | None,
                 sock: socket.socket, factory: SessionFactory | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def stopping() -> None:
        if not stop.is_set():
            stop.set()
            _exit_by(STOP_DEADLINE_S)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stopping)
    worker = EngineWorker(options.queue)
    host, port = sock.getsockname()[:2]
    guard = Guard(host, port, api_key, options.cors)
    connections = Connections()
    server = ApiServer(None, worker, guard, model_ids(config, options.served_names),
                       connections)
    runner = web.AppRunner(server.application(), access_log=None, handle_signals=False,
                           handler_cancellation=True, shutdown_timeout=SHUTDOWN_GRACE_S,
                           keepalive_timeout=connections.keepalive_s)
    await runner.setup()
    await LimitedSite(runner, sock, connections).start()  # 503 "loading" until the models are
    try:
        exchange: ChatExchange = await worker.call(open_exchange, config, _progress,
                                                   options.save, factory)
    except BaseException:
        await runner.cleanup()
        raise
    server.loaded(exchange)
    _progress("", None)
    for note in exchange.session.notes:
        print(f"note: {note}", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"specchat serve: http://{shown}:{port}/v1 (model {server.models[0]}; Ctrl+C stops)",
          flush=True)
    try:
        if not stop.is_set():
            await stop.wait()
    finally:
        print("specchat serve: stopping", file=sys.stderr, flush=True)
        await worker.close(exchange.close)
        await runner.cleanup()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
    return 0
