"""`specchat web`: the chat app in a local browser tab.

An aiohttp server on 127.0.0.1 serves textual-serve's page and terminal (xterm.js). For the
page's WebSocket it starts the app, ``specchat tui`` with the same options, as a subprocess that
Textual's web driver runs on stdin/stdout; textual-serve's ``AppService`` relays between the two.

A page the user visits on the internet can send requests to 127.0.0.1, and a DNS-rebinding page
can even pass for it. So every request must:

- name the server as it bound, ``Host: 127.0.0.1:PORT`` (a rebinding page's requests carry its
  own host name);
- start its path with the secret made at start (``/SECRET/``; compared in constant time), which
  only the printed URL carries: without it, no page, no asset, no app;
- when it carries an ``Origin``, carry the server's own; a WebSocket must carry it (a foreign
  page that learned the URL still cannot drive the app).

A refused request gets a short error and starts nothing. One app runs at a time: while one
does, another tab gets a page saying so (it retries, so a reload of the open tab reconnects),
and a second WebSocket is refused. Ctrl+C (or SIGTERM, SIGHUP) quits the app, then the server;
if the server dies, the app quits by itself (chatapp.tui.web_driver).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import webbrowser
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import textual_serve
from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from chatapp.user_files import write_private

HOST = "127.0.0.1"
STATIC_DIR = Path(textual_serve.__file__).parent / "static"
# What the page loads; nothing else of textual-serve's static folder is served.
ASSETS = {
    "textual.js": ("js/textual.js", "text/javascript"),
    "xterm.css": ("css/xterm.css", "text/css"),
    "RobotoMono.ttf": ("fonts/RobotoMono-VariableFont_wght.ttf", "font/ttf"),
    "RobotoMono-Italic.ttf": ("fonts/RobotoMono-Italic-VariableFont_wght.ttf", "font/ttf"),
}
DRIVER = "chatapp.tui.web_driver:ServedDriver"  # the web driver; the app quits if the server goes
QUIT_GRACE_S = 10.0  # how long the app has to save and exit before SIGTERM
TERM_GRACE_S = 5.0  # and then before SIGKILL
BUSY_RETRY_S = 2


def app_command(options: Sequence[str]) -> list[str]:
    """The app process: this Python's ``specchat tui`` with the web command's model options."""
    return [sys.executable, "-m", "chatapp.cli", "tui", *options]


class AppProcess(AppService):
    """textual-serve's relay for one app process, with these changes: the command runs without a
    shell; in a session of its own, so the terminal's Ctrl+C reaches only the server, which
    quits the app; on a driver that quits the app when the server goes; and ``stop`` ends the
    process for sure (quit, then SIGTERM, then SIGKILL)."""

    def __init__(self, argv: Sequence[str], **kwargs: object) -> None:
        super().__init__(" ".join(argv), **kwargs)  # type: ignore[arg-type]
        self.argv = list(argv)
        self._stopping: asyncio.Task[None] | None = None

    async def _open_app_process(self, width: int = 80, height: int = 24
                                ) -> asyncio.subprocess.Process:
        pipe = asyncio.subprocess.PIPE
        env = self._build_environment(width=width, height=height) | {"TEXTUAL_DRIVER": DRIVER}
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True, env=env)
        assert process.stdin is not None
        self._stdin = process.stdin
        return process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def stop(self) -> None:
        """Quit the app and wait until its process has exited (idempotent)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            await self.send_meta({"type": "quit"})
        for escalate, wait_s in ((None, QUIT_GRACE_S), (process.terminate, TERM_GRACE_S),
                                 (process.kill, None)):
            if process.returncode is not None:
                break
            if escalate is not None:
                try:
                    escalate()
                except ProcessLookupError:
                    pass
            try:
                await asyncio.wait_for(process.wait(), wait_s)
            except TimeoutError:
                pass
        if self._task is not None:  # the relay of its output ends at its stdout's end
            task, self._task = self._task, None
            try:
                await asyncio.wait_for(task, 5.0)
            except Exception:  # noqa: BLE001 (the page is gone: nothing left to relay to)
                pass


def _page(title: str, body: str, style: str = "", head: str = "") -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{html.escape(title)}</title><link rel="icon" href="data:,">{head}'
            '<link rel="stylesheet" href="static/xterm.css"><style>'
            "@font-face{font-family:'Roboto Mono';src:url(static/RobotoMono.ttf)}"
            "@font-face{font-family:'Roboto Mono';font-style:italic;"
            "src:url(static/RobotoMono-Italic.ttf)}"
            "html,body{margin:0;height:100%;background:#121212;color:#e0e0e0;"
            "font-family:'Roboto Mono',monospace}"
            ".note{max-width:40em;margin:20vh auto;padding:0 1em;line-height:1.5}"
            ".note a{color:#57a5e2}"
            f"{style}</style></head><body>{body}</body></html>")


_APP_STYLE = (
    "#terminal{position:absolute;inset:0}"
    ".textual-terminal{opacity:0;transition:opacity .3s}"
    "body.-first-byte .textual-terminal{opacity:1}"
    ".dialog{position:absolute;inset:0;display:flex;align-items:center;justify-content:center;"
    "z-index:10;background:#121212}"
    "body.-first-byte .loading,.closed,#start{display:none}"
    "body.-closed .closed{display:flex}"
)


def app_page(websocket_url: str) -> str:
    """The app's page: textual-serve's terminal element and script, nothing loaded from
    elsewhere (its fonts are served here)."""
    return _page("specchat", (
        '<div class="dialog loading"><p>Starting specchat…</p></div>'
        '<div class="dialog closed"><p class="note">The session ended. '
        '<a href="">Start a new one</a></p></div>'
        '<a id="start" href="">Start</a>'
        f'<div id="terminal" class="textual-terminal" data-font-size="16" '
        f'data-session-websocket-url="{html.escape(websocket_url)}"></div>'
        '<script src="static/textual.js"></script>'), style=_APP_STYLE)


BUSY_PAGE = _page(
    "specchat is already open",
    '<div class="note"><h1>specchat is already open</h1><p>specchat runs one session at a '
    "time, and it is open in another tab or window. Close that tab, or quit the app there "
    "(Ctrl+Q), and this page connects by itself.</p></div>",
    head=f'<meta http-equiv="refresh" content="{BUSY_RETRY_S}">')

# On every answer: no caching, no referrer (the URL holds the secret), no framing, and the page
# may load only from here and connect only back here.
COMMON_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class WebServer:
    """The server for one ``specchat web``: bound on ``start``, running until ``stop``."""

    def __init__(self, app_argv: Sequence[str], port: int = 0,
                 log: Callable[[str], None] | None = None) -> None:
        self.app_argv = list(app_argv)
        self.requested_port = port
        self.secret = secrets.token_urlsafe(32)
        self.port = 0
        self.log = log or (lambda line: print(f"specchat web: {line}", file=sys.stderr))
        self.busy = False  # an app process is running (from its WebSocket to its exit)
        self.closing = False  # stopping: no new app
        self._sessions: set[tuple[web.WebSocketResponse, AppProcess]] = set()
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/{self.secret}/"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (port 0: a free one); raises OSError when it cannot."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, self.requested_port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        app = web.Application(middlewares=[self._guard])
        app.add_routes([
            web.get("/{secret}/", self._index),
            web.get("/{secret}/ws", self._websocket),
            web.get("/{secret}/static/{name}", self._asset),
        ])
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Quit every running app (waiting for it to exit), then close the server."""
        self.closing = True
        for websocket, app in list(self._sessions):
            await app.stop()
            await websocket.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def refusal(self, request: web.Request) -> tuple[int, str] | None:
        """Why ``request`` is refused, as (HTTP status, reason), or None when it may pass."""
        if request.headers.get("Host", "").lower() != f"{HOST}:{self.port}":
            return 421, "this server answers only for the address it printed"
        first = request.raw_path.split("?", 1)[0].split("/")[1:2]
        given = first[0].encode("utf-8", "replace") if first else b""
        if not hmac.compare_digest(given, self.secret.encode()):
            return 403, "the address lacks the secret that specchat web printed"
        origin = request.headers.get("Origin")
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        if (origin is not None or websocket) and origin != self.origin:
            return 403, "requests from other pages are refused"
        return None

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            status, reason = refused
            self.log(f"refused a request ({status}): {reason}")
            return web.Response(status=status, text=f"specchat web: {reason}.\n",
                                headers=COMMON_HEADERS)
        response = await handler(request)
        if not response.prepared:
            response.headers.update(COMMON_HEADERS)
        return response

    async def _index(self, request: web.Request) -> web.Response:
        if self.busy:
            return web.Response(status=409, text=BUSY_PAGE, content_type="text/html")
        websocket_url = f"ws://{HOST}:{self.port}/{self.secret}/ws"
        csp = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
               f"font-src 'self'; img-src 'self' data:; connect-src {websocket_url}; "
               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
        return web.Response(text=app_page(websocket_url), content_type="text/html",
                            headers={"Content-Security-Policy": csp})

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        asset = ASSETS.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound()
        path, content_type = asset
        return web.FileResponse(STATIC_DIR / path, headers={"Content-Type": content_type})

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if self.closing:
            return web.Response(status=503, text="specchat is stopping.\n")
        if self.busy:
            self.log("refused a second session: one is open")
            return web.Response(status=409, text="specchat is already open in another tab.\n")
        self.busy = True  # before any await: two handshakes cannot both get here
        try:
            websocket = web.WebSocketResponse(heartbeat=15)
            await websocket.prepare(request)
            app = AppProcess(self.app_argv, write_bytes=websocket.send_bytes,
                             write_str=websocket.send_str, close=websocket.close,
                             download_manager=DownloadManager())
            session = (websocket, app)
            self._sessions.add(session)
            self.log("started the app for a new tab")
            try:
                await app.start(_size(request, "width", 80), _size(request, "height", 24))
                await _relay(websocket, app)
            finally:
                await app.stop()
                self._sessions.discard(session)
            return websocket
        finally:
            self.busy = False


def _size(request: web.Request, name: str, default: int) -> int:
    try:
        return max(1, min(1000, int(request.query.get(name, default))))
    except ValueError:
        return default


async def _relay(websocket: web.WebSocketResponse, app: AppProcess) -> None:
    """The page's messages to the app, until the page goes (textual-serve's protocol)."""
    async for message in websocket:
        if message.type != WSMsgType.TEXT:
            continue
        try:
            kind, *rest = json.loads(message.data)
        except (ValueError, TypeError):
            continue
        data = rest[0] if rest else None
        if kind == "stdin" and isinstance(data, str):
            await app.send_bytes(data.encode("utf-8", "replace"))
        elif kind == "resize" and isinstance(data, dict):
            try:
                await app.set_terminal_size(max(1, int(data["width"])),
                                            max(1, int(data["height"])))
            except (KeyError, TypeError, ValueError):
                continue
        elif kind == "ping" and isinstance(data, str):
            await websocket.send_json(["pong", data])
        elif kind == "focus":
            await app.focus()
        elif kind == "blur":
            await app.blur()


def open_privately(url: str) -> Path:
    """Open ``url`` in the browser without putting it on the browser's command line, which
    every local user can read (``/proc/PID/cmdline``): the browser opens a page in a private
    folder (0700, the page 0600) that sends it on to ``url``. Returns the folder, for the caller
    to remove."""
    folder = Path(tempfile.mkdtemp(prefix="specchat-web-"))
    page = folder / "open.html"
    target = html.escape(url, quote=True)
    write_private(page, (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>specchat'
                         f'</title><meta name="referrer" content="no-referrer">'
                         f'<meta http-equiv="refresh" content="0;url={target}"></head>'
                         f'<body><a href="{target}">Open specchat</a></body></html>'
                         ).encode("utf-8"))
    webbrowser.open(page.as_uri())
    return folder


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl+C, kill, the terminal closed


async def serve(server: WebServer, open_browser: bool) -> int:
    """Run ``server`` until Ctrl+C (or SIGTERM, SIGHUP); prints its URL and opens it in the
    browser."""
    try:
        await server.start()
    except OSError as error:
        print(f"specchat web: cannot listen on {HOST}:{server.requested_port}: {error}",
              file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    print(f"specchat is at {server.url}\n(the address holds this run's secret: keep it to "
          "yourself; Ctrl+C stops specchat)", flush=True)
    opener = await loop.run_in_executor(None, open_privately, server.url) if (
        open_browser) else None
    try:
        await stop.wait()
    finally:
        print("specchat web: stopping", file=sys.stderr, flush=True)
        if opener is not None:
            shutil.rmtree(opener, ignore_errors=True)
        await server.stop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
    return 0


def web_command(app_argv: Sequence[str], port: int, open_browser: bool) -> int:
    """`specchat web`: serve ``app_argv`` on 127.0.0.1 until Ctrl+C; the exit status."""
    return asyncio.run(serve(WebServer(app_argv, port), open_browser))
