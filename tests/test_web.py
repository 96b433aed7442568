"""`specchat web`: the app in a browser tab, and the server's refusals.

Each test starts its own `specchat web` (tests/web_launcher.py: cli.main with the app process
on fake backends; tests/web_server.py) on a free port of 127.0.0.1, and stops it with SIGINT, as
Ctrl+C does.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatapp.cli import build_parser, main, model_argv
from tests.web_server import REPO, WebServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SCREENSHOT_ENV = "SPECCHAT_WEB_SCREENSHOT"  # a path: the browser test saves its screenshot there


@pytest.fixture
def server(tmp_path: Path):
    server = WebServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def request(port: int, path: str, host: str, headers: dict[str, str] | None = None,
            websocket: bool = False) -> tuple[int, bytes, socket.socket]:
    """One GET on a raw socket (any Host header), or a WebSocket handshake; (status, what was
    read of the answer: all of it, or a handshake's headers; the socket)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"]
    if websocket:
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    else:
        lines.append("Connection: close")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = b""
    while not (websocket and b"\r\n\r\n" in answer):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return int(answer.split(b" ", 2)[1]), answer, sock


def get(server: WebServer, path: str, host: str | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host = server.host if host is None else host
    status, answer, sock = request(server.port, path, host, headers)
    sock.close()
    return status, answer


def open_websocket(server: WebServer, path: str, host: str | None = None,
                   origin: str | None = "own") -> tuple[int, bytes, socket.socket]:
    """A WebSocket handshake, from the server's own page unless ``origin`` says otherwise
    (None: no Origin header)."""
    headers = {} if origin is None else {"Origin": server.origin if origin == "own" else origin}
    host = server.host if host is None else host
    return request(server.port, path, host, headers, websocket=True)


def handshake(server: WebServer, path: str, host: str | None = None,
              origin: str | None = "own") -> tuple[int, bytes]:
    status, answer, sock = open_websocket(server, path, host, origin)
    sock.close()
    return status, answer


def assert_refused_and_nothing_started(server: WebServer, answers: list[tuple[int, bytes]],
                                       status: int = 403) -> None:
    for code, answer in answers:
        assert code == status, answer[:300]
        assert b"textual" not in answer and server.secret.encode() not in answer
    assert server.stop() == 0
    assert server.app_pids() == []
    assert b"started the app" not in server.stderr
    assert server.stderr.count(b"refused") >= len(answers)


def app_paths(prefix: str) -> list[str]:
    """The page, an asset it loads, and the app's WebSocket, under ``prefix``."""
    return [f"{prefix}/", f"{prefix}/static/textual.js", f"{prefix}/ws"]


def test_a_request_without_the_secret_is_refused(server: WebServer) -> None:
    answers = [get(server, path) for path in ["/", "/favicon.ico", *app_paths("")]]
    answers.append(handshake(server, "/ws"))
    assert_refused_and_nothing_started(server, answers)


def test_a_wrong_secret_is_refused(server: WebServer) -> None:
    wrong = [secrets.token_urlsafe(32), server.secret[:-1], server.secret + "x",
             server.secret.swapcase(), f"{server.secret}%2F"]
    answers = [get(server, path) for secret in wrong for path in app_paths(f"/{secret}")]
    answers += [handshake(server, f"/{secret}/ws") for secret in wrong]
    assert_refused_and_nothing_started(server, answers)


def test_a_foreign_origin_is_refused(server: WebServer) -> None:
    prefix = f"/{server.secret}"
    foreign = ["http://evil.example", f"http://localhost:{server.port}", "null",
               f"https://{server.host}", f"http://127.0.0.1:{server.port + 1}"]
    # a WebSocket must say where it comes from: None, no Origin header, is refused too
    answers = [handshake(server, f"{prefix}/ws", origin=origin) for origin in [*foreign, None]]
    answers += [get(server, path, headers={"Origin": origin})
                for origin in foreign for path in app_paths(prefix)]
    assert_refused_and_nothing_started(server, answers)


def test_a_foreign_host_is_refused(server: WebServer) -> None:
    prefix = f"/{server.secret}"
    # DNS rebinding: the browser thinks it talks to evil.example, and says so in Host
    foreign = [f"evil.example:{server.port}", "evil.example", f"localhost:{server.port}",
               f"127.0.0.1:{server.port + 1}", f"[::1]:{server.port}", ""]
    answers = [get(server, path, host=host) for host in foreign for path in app_paths(prefix)]
    answers += [handshake(server, f"{prefix}/ws", host=host) for host in foreign]
    assert_refused_and_nothing_started(server, answers, status=421)


def test_one_session_at_a_time_and_a_second_tab_is_told(server: WebServer) -> None:
    prefix = f"/{server.secret}"
    status, page = get(server, f"{prefix}/")
    assert status == 200 and b"static/textual.js" in page
    status, _, first = open_websocket(server, f"{prefix}/ws")
    assert status == 101
    try:
        [pid] = server.wait_for_apps(1)
        status, page = get(server, f"{prefix}/")
        assert status == 409 and b"already open" in page and b"textual.js" not in page
        assert handshake(server, f"{prefix}/ws")[0] == 409
    finally:
        first.close()  # the tab goes: the app quits, and the next tab may open it
    deadline = time.monotonic() + 15
    while get(server, f"{prefix}/")[0] != 200:
        assert time.monotonic() < deadline, "the session never ended after its tab went"
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()
    assert server.stop() == 0
    assert server.app_pids() == [pid]


def test_the_app_quits_by_itself_when_the_server_is_killed(server: WebServer) -> None:
    status, _, tab = open_websocket(server, f"/{server.secret}/ws")
    assert status == 101
    try:
        [pid] = server.wait_for_apps(1)
        time.sleep(1)  # the app is up
        server.process.kill()  # no Ctrl+C: nobody quits the app, its stdin just ends
        deadline = time.monotonic() + 15
        while Path(f"/proc/{pid}").exists() and not is_zombie(pid):
            assert time.monotonic() < deadline, "the app ran on without its server"
            time.sleep(0.1)
    finally:
        tab.close()


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


async def test_an_app_that_does_not_quit_is_terminated_then_killed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from textual_serve.download_manager import DownloadManager

    import chatapp.web

    monkeypatch.setattr(chatapp.web, "QUIT_GRACE_S", 0.2)
    monkeypatch.setattr(chatapp.web, "TERM_GRACE_S", 0.2)
    deaf = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('__GANGLION__', flush=True); time.sleep(60)")

    async def ignore(*args: object) -> None:
        pass

    app = chatapp.web.AppProcess([sys.executable, "-c", deaf], write_bytes=ignore,
                                 write_str=ignore, close=ignore,
                                 download_manager=DownloadManager())
    await app.start(80, 24)
    await asyncio.sleep(0.5)  # past its SIGTERM handler
    assert os.getsid(app.pid) != os.getsid(0)  # its own session: the terminal's Ctrl+C skips it
    started = time.monotonic()
    await app.stop()
    await app.stop()  # a second stop waits for the same end
    assert app._process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets ``pid`` listens on (hex, as /proc/net shows)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def test_it_listens_on_loopback_only_and_stops_when_its_terminal_closes(
        server: WebServer) -> None:
    assert listening_addresses(server.process.pid) == [f"0100007F:{server.port:04X}"]
    assert server.stop(signal.SIGHUP) == 0 and b"stopping" in server.stderr


def test_the_chat_app_and_run_do_not_load_the_web_server() -> None:
    code = ("import sys, chatapp.cli, chatapp.tui.app; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('aiohttp', 'textual_serve', 'webbrowser') or m == 'chatapp.web'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_web_passes_the_model_options_on_to_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--seed", "7", "web", "--draft", "tiny", "-k", "auto", "--system", "-be brief",
            "--temperature", "0.5", "--port", "8123", "--no-open"]
    options = model_argv(build_parser().parse_args(argv))
    assert sorted(options) == ["--draft-length=auto", "--draft=tiny", "--seed=7",
                               "--system=-be brief", "--temperature=0.5"]
    again = vars(build_parser().parse_args(["tui", *options]))
    assert {k: again[k] for k in ("seed", "draft", "draft_length", "system_prompt")} == \
        {"seed": 7, "draft": "tiny", "draft_length": "auto", "system_prompt": "-be brief"}
    calls = []
    monkeypatch.setattr("chatapp.web.web_command", lambda *args: calls.append(args) or 0)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    assert main(argv) == 0
    [(app_argv, port, open_browser)] = calls
    assert app_argv[:4] == [sys.executable, "-m", "chatapp.cli", "tui"]
    assert sorted(app_argv[4:]) == sorted(options) and (port, open_browser) == (8123, False)


# -- In a real browser ---------------------------------------------------------------------

ANSI = re.compile(rb"\x1b\[[0-9;?<>]*[A-Za-z]")


def rgb(hex_colour: str) -> list[int]:
    return [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]


def sgr_background(hex_colour: str) -> bytes:
    """The escape sequence's parameters for a 24-bit background colour."""
    return "48;2;{};{};{}".format(*rgb(hex_colour)).encode()


COUNT_COLOUR_JS = """async ([png, colours]) => {
    const image = new Image();
    image.src = "data:image/png;base64," + png;
    await image.decode();
    const canvas = document.createElement("canvas");
    canvas.width = image.width; canvas.height = image.height;
    const context = canvas.getContext("2d");
    context.drawImage(image, 0, 0);
    const data = context.getImageData(0, 0, image.width, image.height).data;
    return colours.map(([r, g, b]) => {
        let count = 0;
        for (let i = 0; i < data.length; i += 4)
            if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 12)
                count++;
        return count;
    });
}"""


def wait_for_text(page, frames: list[bytes], pattern: bytes, what: str,
                  timeout: float = 20) -> None:
    """Wait until the text the page received over its WebSocket (``frames``) matches."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, ANSI.sub(b"", b"".join(frames))):
        assert time.monotonic() < deadline, f"the page never showed {what}"
        page.wait_for_timeout(50)


def open_page(browser, frames: list[bytes], errors: list[str]):
    """A page that appends what its WebSocket receives to ``frames`` and its console's and
    script's errors to ``errors``."""
    page = browser.new_page(viewport={"width": 1100, "height": 680})
    page.set_default_timeout(15_000)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("websocket", lambda ws: ws.on(
        "framereceived", lambda f: frames.append(f if isinstance(f, bytes) else b"")))
    return page


def say_hello_in_a_browser(server: WebServer, colours: list[list[int]]
                           ) -> tuple[bytes, list[str], bytes, list[list[int]]]:
    """Open the app in headless Chromium, show the statistics, send "Hello there", wait for the
    reply, then stop the server with the tab open. Returns what the page received, its errors,
    the screenshot after the reply, and the pixels of each of ``colours`` before and after."""
    import base64

    from playwright import sync_api

    frames: list[bytes] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                             timeout=20_000)
        try:
            page = open_page(browser, frames, errors)
            page.goto(server.url)
            page.wait_for_selector("body.-first-byte")
            wait_for_text(page, frames, rb"Message \(Enter sends", "the message box")
            page.focus("textarea.xterm-helper-textarea")
            page.keyboard.press("F2")  # the statistics panel
            wait_for_text(page, frames, rb"No reply yet\. Statistics", "the statistics panel")
            page.wait_for_timeout(300)
            before = page.screenshot()
            page.keyboard.type("Hello there")
            page.keyboard.press("Enter")
            wait_for_text(page, frames, rb"Turn 1 \xc2\xb7 (done|cut at max tokens)",
                          "the finished reply")
            wait_for_text(page, frames, rb"Tokens/s", "the speed statistics")
            page.wait_for_timeout(500)  # xterm.js paints what it received
            after = page.screenshot()
            counts = [page.evaluate(COUNT_COLOUR_JS, [base64.b64encode(png).decode(), colours])
                      for png in (before, after)]
            [pid] = server.app_pids()
            assert server.stop() == 0  # Ctrl+C with the tab open: the app quits, then the server
            assert not Path(f"/proc/{pid}").exists()
            page.wait_for_selector("body.-closed")  # the tab says the session ended
        finally:
            browser.close()
    return b"".join(frames), errors, after, counts


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                    "(apt-get install chromium)")
def test_a_reply_streams_into_a_browser_tab_with_its_colours_and_stats(
        server: WebServer, tmp_path: Path) -> None:
    from chatapp.chat.history import HistoryStore
    from chatapp.settings.config import Config
    from chatapp.tui.app import SpecChatApp

    theme = SpecChatApp(Config()).get_css_variables()
    accepted, resampled = theme["success-muted"], theme["warning-muted"]  # the tokens' tints
    received, errors, after, counts = say_hello_in_a_browser(
        server, [rgb(accepted), rgb(resampled)])
    text = ANSI.sub(b"", received)
    for label in (b"Hello there", b"Speculation", b"Drafted", b"Accepted", b"Per target call",
                  b"Acceptance by position", b"verify", b"First token"):
        assert label in text, label
    assert sgr_background(accepted) in received and sgr_background(resampled) in received
    (before_accepted, before_resampled), (after_accepted, after_resampled) = counts
    assert after_accepted > before_accepted + 200, counts  # the reply's tokens, painted
    assert after_resampled > before_resampled + 200, counts
    assert errors == [], errors
    (tmp_path / "web.png").write_bytes(after)
    if os.environ.get(SCREENSHOT_ENV):
        Path(os.environ[SCREENSHOT_ENV]).write_bytes(after)
    store = HistoryStore(tmp_path / "history.sqlite3")
    [chat] = store.list_chats()
    stored = [(m.role, m.content) for m in store.messages(chat.id)]
    store.close()
    assert stored[0] == ("user", "Hello there") and stored[1][0] == "assistant"
    assert len(stored) == 2 and stored[1][1].strip()  # the reply, saved when the app quit
