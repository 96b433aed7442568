"""Issue 4, "nothing the user wrote is lost": the chat app under awkward input and a hostile
terminal. Empty and huge messages, control characters and every kind of Unicode, a terminal
resized to almost nothing mid-reply, and a terminal that goes away (SIGHUP) or a system that
shuts down (SIGTERM) while a reply streams.

The Pilot tests run headless on the deterministic fake backends of conftest.py; the signal tests
start the app in a real pseudo-terminal (tests/tui_launcher.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import select
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
from textual import events

from chatapp.chat.history import HistoryStore
from chatapp.chat.loader import generation_settings
from chatapp.chat.terminal_text import Printable
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.events import TokenEvent
from chatapp.engine.loop import SpeculativeEngine
from chatapp.settings.config import Config
from chatapp.tui.widgets import MessageView, Note, TokenText
from tests.conftest import (
    EndlessFakeBackend,
    RecordingSession,
    keys,
    ready,
    reply_done,
    send,
    tui_fake_factory,
    wait_for,
)

SIZE = (120, 40)
REPO = Path(__file__).resolve().parent.parent

# Everything a terminal might act on: C0 controls but newline and tab, DEL, C1 controls.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

# Hostile and unusual text: escape sequences (colour, clear screen, set the window title, an 8-bit
# CSI), NUL, bell, a bare carriage return, tab, DEL, emoji with a ZWJ sequence and skin tones, a
# flag, combining marks, CJK, Arabic and Hebrew mixed with Latin, a zero-width space, an RTL mark.
# In the message box a CR is a line break (terminals paste line breaks as CR): the message holds
# an LF there, and every other character exactly.
HOSTILE_TEXT = ("red? \x1b[31mRED\x1b[0m clear \x1b[2J title \x1b]0;PWNED\x07 csi \x9b31m "
                "nul \x00 bell \x07 cr \r tab \t del \x7f\n"
                "emoji 👩🏽‍💻 👨‍👩‍👧‍👦 👍🏿 🇫🇷 combining e\u0301 a\u0308\u0323 Z\u0335\u0321\u0336 "
                "CJK 中文字符 日本語 한국어\n"
                "RTL: English then עברית and العربية mixed 123 with Latin, "
                "\u200bzero-width \u200fRLM end")
HOSTILE_MESSAGE = HOSTILE_TEXT.replace("\r", "\n")


def views(app, role: str | None = None) -> list[MessageView]:
    return [v for v in app.query(MessageView) if role is None or v.role == role]


def stored(app, chat_id: int | None = None):
    chat_id = chat_id if chat_id is not None else app.chat.chat_id
    return app.chat.history.messages(chat_id)


def reply_tokens(session, turn: int = -1) -> list[TokenEvent]:
    return [e for e in session.turns[turn] if isinstance(e, TokenEvent)]


async def paste(pilot, text: str) -> None:
    """Deliver ``text`` as the terminal delivers a paste: a Paste event to the app, which hands
    it to the focused widget."""
    app = pilot.app
    before = app.chat_input.text
    app.post_message(events.Paste(text))
    await wait_for(pilot, lambda: app.chat_input.text != before, what="the paste")
    await pilot.pause()


def screen_output(app) -> tuple[list[str], str]:
    """What the app would put on the terminal now: the text of every cell run, and the full
    byte stream (escape sequences included) Textual writes for a full redraw."""
    update = app.screen._compositor.render_full_update()
    cells = [segment.text for line in update.strips for strip in line for segment in strip]
    return cells, update.render_segments(app.console)


def assert_screen_is_safe(app) -> str:
    """No cell of the screen holds a control character, and the stream to the terminal holds
    no escape sequence but Textual's own colours and cursor moves. Returns the screen's text."""
    cells, stream = screen_output(app)
    for text in cells:
        assert not TERMINAL_CONTROLS.search(text), f"control character on screen: {text!r}"
    own = re.sub(r"\x1b\[[0-9;:]*[mHK]|\x1b\[\?[0-9;]*[hl]", "", stream)
    assert "\x1b" not in own, f"raw ESC reaches the terminal: {own[own.find(chr(27)) - 20:][:60]!r}"
    assert "\x9b" not in own and "\x07" not in own and "\x00" not in own
    return "".join(cells)


def assert_renderable_is_safe(text) -> None:
    """A Rich Text (or string) holds no control character but newline and tab."""
    plain = text.plain if hasattr(text, "plain") else str(text)
    assert not TERMINAL_CONTROLS.search(plain), repr(plain[:200])


# -- 1. empty and whitespace-only input -----------------------------------------------------------

@pytest.mark.parametrize("blank", ["", " ", "   \n\t\n  ", "\n\n\n"])
async def test_blank_input_sends_nothing_and_keeps_focus(tui_make_app, blank):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.chat_input.text = blank
        await keys(pilot, "enter")
        await keys(pilot, "enter")
        await pilot.pause()
        assert views(app) == []
        assert app.chat.turn is None and app.chat.session.turns == []  # the model was never called
        assert app.chat.history.list_chats() == [] and app.chat.chat_id is None
        assert app.focused is app.chat_input
        assert app.chat_input.text == blank  # what was there stays (nothing typed is dropped)
        assert not app._notifications  # no nagging either
        # The input still works: a real message after the blank ones goes out.
        app.chat_input.text = "now a question"
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert [m.content for m in stored(app)][:1] == ["now a question"]
        assert len(app.chat.session.turns) == 1


async def test_blank_enter_while_a_reply_streams_leaves_it_alone(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.01, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "stream please")
        turn = app.chat.turn
        await wait_for(pilot, lambda: len(turn.steps) >= 3, what="three steps")
        for blank in ("", "  ", "\n\t"):
            app.chat_input.text = blank
            await keys(pilot, "enter")
            assert app.chat.turn is turn and not turn.cancel.is_set()
        steps = len(turn.steps)
        await wait_for(pilot, lambda: len(turn.steps) >= steps + 3, what="more steps")
        assert app.focused is app.chat_input
        assert not app._notifications
        assert [v.role for v in views(app)] == ["user", "assistant"]
        await keys(pilot, "escape")
        await reply_done(pilot)
        assert len(app.chat.session.turns) == 1
        reply = views(app, "assistant")[0]
        assert reply.finish_reason == "cancelled"
        assert reply.plain == "".join(e.text for e in reply_tokens(app.chat.session)) != ""
        assert [(m.role, m.content) for m in stored(app)] == [
            ("user", "stream please"), ("assistant", reply.plain)]


# -- 2. a very long paste --------------------------------------------------------------------------

def long_text(size: int = 200_000) -> str:
    """About ``size`` characters on many lines: words, numbers, tabs, accents, CJK, emoji."""
    lines, total, n = [], 0, 0
    while total < size:
        line = (f"{n:05d}\tthe speculative draft token is accepted, the target verifies "
                f"it — ünïcödé 中文 😀 {n * 7919 % 10007}")
        lines.append(line)
        total += len(line) + 1
        n += 1
    return "\n".join(lines)[:size]


async def test_a_long_paste_is_sent_intact_and_the_app_stays_responsive(tui_make_app):
    text = long_text()
    assert len(text) == 200_000 and text.count("\n") > 2000
    app = tui_make_app(tui_fake_factory(max_tokens=40, n_ctx=1_000_000))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        started = time.monotonic()
        await paste(pilot, text)
        assert app.chat_input.text == text
        await keys(pilot, "enter")
        # Responsive while the long prompt is planned and the reply streams: the message shows
        # at once, the box is free again, and typing goes on (the next message, not sent yet).
        await wait_for(pilot, lambda: views(app, "user") and app.chat_input.text == "",
                       timeout=10, what="the message shown")
        await keys(pilot, *"next")
        await wait_for(pilot, lambda: app.chat_input.text == "next", timeout=5, what="typing")
        await reply_done(pilot)
        elapsed = time.monotonic() - started
        user = views(app, "user")[0]
        assert user.plain == text
        first = stored(app)[0]
        assert (first.role, first.content) == ("user", text)
        assert app.chat.messages[0].content == text
        assert views(app, "assistant")[0].finish_reason in ("stop", "length")
        assert app.chat_input.text == "next"
        assert elapsed < 30, elapsed  # seconds, not minutes (about 5 s on 2 busy cores)


async def test_a_paste_too_long_for_the_context_goes_back_into_the_input(tui_make_app, tmp_path):
    text = long_text()
    app = tui_make_app(tui_fake_factory(n_ctx=4096))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await paste(pilot, text)
        await keys(pilot, "enter")
        await wait_for(pilot, lambda: app.chat.turn is None and app.chat_input.text != "",
                       timeout=30, what="the text back in the input")
        await pilot.pause()
        assert app.chat_input.text == text  # every character, in the input again
        assert app.focused is app.chat_input
        assert views(app) == []
        note = " ".join(n.render().plain for n in app.query(Note))
        assert "context window" in note and "Shorten the message" in note
        assert "--n-ctx" in note or "F4" in note
        assert "back in the message box" in note
        assert "Unexpected error" not in note and "Traceback" not in note
        assert app.chat.history.list_chats() == []
        # Trimmed, the same message goes out.
        app.chat_input.text = text[:1000]
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert stored(app)[0].content == text[:1000]


# -- 3. control characters and Unicode -------------------------------------------------------------

def random_location(rng, document) -> tuple[int, int]:
    row = rng.randrange(document.line_count)
    return row, rng.randrange(len(document[row]) + 1)


def test_the_message_box_document_edits_like_textuals_for_lf_text():
    """``ChatDocument`` only changes where lines break: for text with LF line breaks, random
    edits give the same text, lines and results as Textual's own ``Document``."""
    import random

    from textual.widgets.text_area import Document

    from chatapp.tui.chat_input import ChatDocument

    rng = random.Random(4)
    alphabet = ["a", "b", " ", "\n", "é", "中", "😀", "\t", "\n\n", "xyz"]
    for _ in range(30):
        start_text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        ours, theirs = ChatDocument(start_text), Document(start_text)
        assert ours.text == theirs.text == start_text and ours.lines == theirs.lines
        for _ in range(40):
            start, end = random_location(rng, theirs), random_location(rng, theirs)
            insert = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
            assert ours.get_text_range(start, end) == theirs.get_text_range(start, end)
            assert ours.replace_range(start, end, insert) == theirs.replace_range(start, end,
                                                                                 insert)
            assert ours.text == theirs.text and ours.lines == theirs.lines

async def test_control_characters_and_unicode_from_the_user_are_stored_exactly_and_shown_safely(
        tui_make_app, tmp_path):
    app = tui_make_app(tui_fake_factory(max_tokens=20))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await paste(pilot, HOSTILE_TEXT)
        assert app.chat_input.text == HOSTILE_MESSAGE
        screen = assert_screen_is_safe(app)  # the message box shows it safely too
        assert "␛[31mRED" in screen and "␀" in screen
        await keys(pilot, "enter")
        await reply_done(pilot)
        user = views(app, "user")[0]
        assert user.plain == HOSTILE_MESSAGE
        assert stored(app)[0].content == HOSTILE_MESSAGE
        assert app.chat.messages[0].content == HOSTILE_MESSAGE
        body = user.query_one(".message-body").render()
        assert_renderable_is_safe(body)
        # What cannot be shown is shown as a visible symbol, one per character; the rest as is.
        assert len(body.plain) == len(HOSTILE_MESSAGE)
        for shown in ("␛[31mRED", "␛]0;PWNED␇", "nul ␀ bell ␇"):
            assert shown in body.plain
        for piece in ("👩🏽‍💻", "👨‍👩‍👧‍👦", "e\u0301", "中文字符", "עברית", "العربية"):
            assert piece in body.plain
        screen = assert_screen_is_safe(app)
        assert "PWNED" in screen and "中文字符" in screen
        title = app.chat.history.list_chats()[0].title
        assert not TERMINAL_CONTROLS.search(title) and title.startswith("red? ␛[31mRED")
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    assert store.messages(store.list_chats()[0].id)[0].content == HOSTILE_MESSAGE
    store.close()


async def test_the_chat_list_shows_a_title_stored_raw_safely(tui_make_app, tmp_path):
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")  # e.g. written by an older version
    store.create_chat("evil \x1b]0;PWNED\x07 title\nsecond line", draft="d\x1b[2J", target="t")
    store.close()
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await keys(pilot, "ctrl+o")
        await pilot.pause()
        screen = assert_screen_is_safe(app)
        assert "evil ␛]0;PWNED␇ title second line" in screen and "d␛[2J → t" in screen


async def test_keys_arriving_in_one_burst_keep_their_order(tui_make_app):
    # A fast typist, or a terminal pasting without bracketed paste: the new-line keys arrive in
    # the same read as the letters around them and must land where they were typed.
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.chat_input.focus()
        for name in ["a", "ctrl+j", "b", "shift+enter", "c"]:
            app.simulate_key(name)  # no pause between them
        await wait_for(pilot, lambda: "c" in app.chat_input.text, what="the keys")
        await pilot.pause()
        assert app.chat_input.text == "a\nb\nc"


async def test_pasted_line_breaks_become_lf_and_other_separators_are_kept(tui_make_app):
    """The message box breaks lines at LF, CR LF and CR only (however the terminal pastes them,
    the message has LF), and keeps form feeds, vertical tabs, Unicode line separators... as they
    came, where a plain Textual TextArea turns them into line breaks."""
    text = "dos\r\nline\r\nunix\nmac\rold\x0cpage\x0bvt\u2028ls\u2029ps\x85nel\x1cfs end\r\n"
    message = "before " + text.replace("\r\n", "\n").replace("\r", "\n")
    app = tui_make_app(tui_fake_factory(max_tokens=10))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await paste(pilot, "before ")
        await paste(pilot, text)
        assert app.chat_input.text == message
        assert app.chat_input.document.line_count == 6  # CRLF, CRLF, LF, CR, CRLF
        assert_screen_is_safe(app)
        await keys(pilot, "ctrl+z")  # undo the paste: exactly the text before it
        await pilot.pause()
        assert app.chat_input.text == "before "
        await keys(pilot, "ctrl+y")
        await pilot.pause()
        assert app.chat_input.text == message
        # Given back (a failed reply, a message taken back while loading): exactly the same.
        app.chat_input.text = ""
        app.chat_input.restore(message)
        assert app.chat_input.text == message
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert stored(app)[0].content == message
        assert_renderable_is_safe(views(app, "user")[0].query_one(".message-body").render())


class WeirdFakeBackend(EndlessFakeBackend):
    """A fake model some of whose letters are hostile or unusual strings: the reply is full of
    them."""

    PIECES: ClassVar[dict[int, str]] = {
        1: "\x1b[31m", 2: "\x00", 3: "\x07", 18: "\r", 24: "\t", 6: "\x7f", 25: "\r\n",
        7: "👩🏽‍💻", 8: "e\u0301", 9: "中文", 10: "שלום", 11: "مرحبا", 12: "\x1b]0;PWNED\x07",
        13: "\u2028", 14: "\x9b2J"}

    def token_bytes(self, token: int) -> bytes:
        piece = self.PIECES.get(token)
        return piece.encode() if piece is not None else super().token_bytes(token)


def weird_factory(max_tokens: int):
    def factory(config: Config, progress) -> RecordingSession:
        engine = SpeculativeEngine(WeirdFakeBackend(),
                                   ModelDrafter(WeirdFakeBackend(noise=1.0)))
        settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        return RecordingSession(engine, settings, seed=0)

    return factory


async def test_a_reply_with_control_characters_is_shown_safely_and_stored_exactly(
        tui_make_app):
    app = tui_make_app(weird_factory(max_tokens=300))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "say something odd")
        await reply_done(pilot)
        tokens = reply_tokens(app.chat.session)
        text = "".join(e.text for e in tokens)
        for piece in ("\x1b[31m", "\x00", "\r", "\x7f", "中文", "\x1b]0;PWNED\x07"):
            assert piece in text  # the fake really produced the hostile pieces
        reply = views(app, "assistant")[0]
        assert reply.plain == text
        saved = stored(app)[1]
        assert saved.content == text
        assert saved.runs is not None and "".join(t for t, _ in saved.runs) == text
        widget = reply.query_one(TokenText)
        rendered = widget.render()
        assert_renderable_is_safe(rendered)
        shown = rendered.plain
        assert "␛[31m" in shown and "␛]0;PWNED␇" in shown and "␀" in shown and "␡" in shown
        assert shown.count("␇") == text.count("\x07") and shown.count("中文") == text.count("中文")
        assert shown.count("\t") == text.count("\t")
        # CR LF and a lone CR are line breaks, split across tokens or not.
        assert shown.count("\n") == text.count("\n") + text.count("\r") - text.count("\r\n")
        # Each shown character lies in the span of its token's source (the colours do not drift
        # when a token's text is shown shorter than it is).
        sources = [None] * len(shown)
        for span in rendered.spans:
            for i in range(span.start, span.end):
                sources[i] = span.style.meta["token"]
        piecewise = Printable()
        assert sources == [e.source.value for e in tokens for _ in piecewise(e.text)]
        streamed = [(s.start, s.end, s.style.meta["token"]) for s in rendered.spans]
        widget._restyle()  # built again at once from the runs: the same text, the same spans
        rebuilt = widget.render()
        assert rebuilt is not rendered and rebuilt.plain == shown
        assert [(s.start, s.end, s.style.meta["token"]) for s in rebuilt.spans] == streamed
        assert_screen_is_safe(app)
        # The same reply as Markdown (F3) is as safe.
        await keys(pilot, "f3")
        await wait_for(pilot, lambda: reply.markdown is not None, what="the Markdown view")
        await pilot.pause(0.1)
        assert_screen_is_safe(app)
        # And reopened from the history.
        await app.chat_view.open_chat(app.chat.chat_id)
        await pilot.pause()
        assert views(app, "assistant")[0].plain == text
        await keys(pilot, "f3")
        await pilot.pause(0.1)
        assert_renderable_is_safe(views(app, "assistant")[0].query_one(TokenText).render())
        assert_screen_is_safe(app)


# -- 4. the terminal resized mid-reply -------------------------------------------------------------

async def test_resizing_to_a_tiny_terminal_mid_reply_loses_nothing(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=400, delay_s=0.005, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "keep going")
        turn = app.chat.turn
        await wait_for(pilot, lambda: len(turn.steps) >= 3, what="three steps")
        for size in ((20, 6), (120, 40), (1, 1), (20, 6), (60, 12), (120, 40)):
            steps = len(turn.steps)
            await pilot.resize_terminal(*size)
            await wait_for(pilot, lambda steps=steps: len(turn.steps) >= steps + 2 or turn.done,
                           what=f"steps at {size}")
        await reply_done(pilot)
        await pilot.pause()
        reply = views(app, "assistant")[0]
        tokens = reply_tokens(app.chat.session)
        assert len(tokens) == 400 and reply.finish_reason == "length"
        assert reply.plain == "".join(e.text for e in tokens)
        assert stored(app)[1].content == reply.plain
        # The layout is back: the input is on screen, full width, focused and takes keys; the
        # conversation still follows the end of the reply.
        box = app.chat_input.region
        assert box.height >= 3 and box.width > 100
        assert app.screen.region.contains_region(box)
        assert app.focused is app.chat_input
        conversation = app.message_list
        assert conversation.region.height > 20
        assert reply.region.height > 3 and conversation.region.contains_region(reply.region)
        await keys(pilot, *"ok")
        assert app.chat_input.text == "ok"
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert [v.role for v in views(app)] == ["user", "assistant"] * 2


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
