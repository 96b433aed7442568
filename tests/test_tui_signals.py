"""Issue 4, "nothing the user wrote is lost", when the terminal goes away (SIGHUP) or the system
shuts down (SIGTERM) while a reply streams: in process, and with the app in a real
pseudo-terminal (tests/tui_launcher.py). The other awkward inputs are in
tests/test_tui_robustness.py.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from chatapp.chat.history import HistoryStore
from tests.conftest import (
    ready,
    send,
    tui_fake_factory,
    wait_for,
)

SIZE = (120, 40)
REPO = Path(__file__).resolve().parent.parent


# -- 5. the terminal closed (SIGHUP) or the system shutting down (SIGTERM) mid-reply --------------

@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
async def test_sigterm_quits_like_ctrl_q_and_gives_the_signals_back(tui_make_app, tmp_path):
    """In process: SIGTERM mid-reply ends the app like ctrl+q, and the handlers from before the
    app are back afterwards. (A handler of the test's own stands in for the default, which would
    end pytest, should the app not catch the signal.)"""
    caught: list[int] = []

    def before_the_app(signum, frame) -> None:
        caught.append(signum)

    quit_signals = (signal.SIGHUP, signal.SIGTERM)
    saved = {signum: signal.signal(signum, before_the_app) for signum in quit_signals}
    try:
        app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.01, endless=True))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, "terminate me")
            await wait_for(pilot, lambda: app.chat.turn is not None
                           and len(app.chat.turn.steps) >= 3, what="three steps")
            chat_id = app.chat.chat_id
            os.kill(os.getpid(), signal.SIGTERM)
            await wait_for(pilot, lambda: not app.is_running, what="the exit")
        assert caught == []  # the app had the signal
        assert app.return_code == 128 + signal.SIGTERM
        assert all(signal.getsignal(signum) is before_the_app for signum in quit_signals)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    messages = store.messages(chat_id)
    store.close()
    assert [(m.role, m.finish_reason) for m in messages] == [("user", None),
                                                             ("assistant", "cancelled")]
    assert messages[1].content and messages[1].stats.tokens > 0

class Terminal:
    """The app in a pseudo-terminal, as a terminal emulator runs it."""

    def __init__(self, history: Path, stacks: Path, columns: int = 100, rows: int = 30) -> None:
        import fcntl
        import pty
        import struct
        import termios

        pid, fd = pty.fork()
        if pid == 0:  # the child: the app, with the pty as its terminal
            try:
                os.chdir(REPO)
                os.environ.update(TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
                os.execv(sys.executable, [sys.executable, "-m", "tests.tui_launcher",
                                          str(history), str(stacks)])
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.output = bytearray()
        self.status: int | None = None

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.fd is not None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # the app is gone
                    return
                if not data:
                    return
                self.output.extend(data)

    def wait_for_screen(self, pattern: bytes, timeout: float = 15) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.read(0.05)
            match = re.search(pattern, self.output)
            if match:
                return match
            assert self.poll() is None, f"the app ended early: {self.output[-2000:]!r}"
        raise AssertionError(f"timed out waiting for {pattern!r}: {self.output[-2000:]!r}")

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def hang_up(self) -> None:
        """Close the terminal: the kernel sends SIGHUP to the app, its tty reads and writes
        fail from now on."""
        os.close(self.fd)
        self.fd = None

    def poll(self) -> int | None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            self.read(0.05) if self.fd is not None else time.sleep(0.05)
        return self.status

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX terminals and signals")
@pytest.mark.parametrize("how", ["terminal closed", "SIGHUP", "SIGTERM"])
def test_the_partial_reply_survives_the_terminal_going_away(tmp_path, how):
    history = tmp_path / "data" / "history.sqlite3"
    terminal = Terminal(history, tmp_path / "stacks.txt")
    try:
        terminal.wait_for_screen(rb"ready")
        terminal.type(b"hello from the pty\r")
        # The reply streams: its header counts the tokens ("Assistant · K 3 · 57 tok · ...").
        terminal.wait_for_screen(rb"\b[2-9]\d tok\b")
        if how == "terminal closed":
            terminal.hang_up()
        else:
            os.kill(terminal.pid, getattr(signal, how))
        status = terminal.wait(timeout=15)
        if status is None:
            os.kill(terminal.pid, signal.SIGUSR1)
            time.sleep(1)
            stacks = (tmp_path / "stacks.txt").read_text()
            raise AssertionError(f"the app did not exit after {how}:\n{stacks}")
        assert os.WIFEXITED(status), (
            f"the app died of signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else status)
        signum = signal.SIGHUP if how == "terminal closed" else getattr(signal, how)
        assert os.WEXITSTATUS(status) == 128 + signum
        if how != "terminal closed":  # a terminal still there is given back as it was
            terminal.read(0.2)
            last_start = terminal.output.rfind(b"\x1b[?1049h")  # the alternate screen
            assert last_start >= 0
            assert b"\x1b[?1049l" in terminal.output[last_start:]  # left
            assert b"\x1b[?25h" in terminal.output[last_start:]  # the cursor shown again
    finally:
        terminal.kill()
    db = sqlite3.connect(history)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    db.close()
    store = HistoryStore(history)
    chats = store.list_chats()
    assert len(chats) == 1
    messages = store.messages(chats[0].id)
    store.close()
    assert [(m.role, m.finish_reason) for m in messages] == [("user", None),
                                                             ("assistant", "cancelled")]
    assert messages[0].content == "hello from the pty"
    reply = messages[1]
    assert reply.stats is not None and reply.stats.tokens >= 20
    assert len(reply.content) >= 20
    assert "".join(text for text, _ in reply.runs) == reply.content
