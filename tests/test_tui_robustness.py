"""Issue 4, "nothing the user wrote is lost": the chat app under awkward input and a hostile
terminal. Empty and huge messages, control characters and every kind of Unicode, a terminal
resized to almost nothing mid-reply, and a terminal that goes away (SIGHUP) or a system that
shuts down (SIGTERM) while a reply streams.

The Pilot tests run headless on the deterministic fake backends of conftest.py; the signal tests
start the app in a real pseudo-terminal (tests/tui_launcher.py).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import ClassVar

import pytest

from chatapp.chat.history import HistoryStore
from chatapp.chat.reply_settings import generation_settings
from chatapp.chat.terminal_text import Printable
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.events import TokenEvent
from chatapp.engine.loop import SpeculativeEngine
from chatapp.settings.config import Config
from chatapp.tui.reply_text import ReplyText
from tests.conftest import (
    EndlessFakeBackend,
    RecordingSession,
    keys,
    paste,
    ready,
    reply_done,
    send,
    stored,
    tui_fake_factory,
    views,
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


def reply_tokens(session, turn: int = -1) -> list[TokenEvent]:
    return [e for e in session.turns[turn] if isinstance(e, TokenEvent)]


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

# -- 3. control characters and Unicode -------------------------------------------------------------

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
        widget = reply.query_one(ReplyText)
        rendered = widget.text
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
        rebuilt = widget.text
        assert rebuilt is not rendered and rebuilt.plain == shown
        assert [(s.start, s.end, s.style.meta["token"]) for s in rebuilt.spans] == streamed
        assert_screen_is_safe(app)
        # The same reply without the token colours (F3) is as safe.
        await keys(pilot, "f3")
        await pilot.pause(0.1)
        assert widget.text.plain == shown
        assert_screen_is_safe(app)
        # And reopened from the history.
        await app.chat_view.open_chat(app.chat.chat_id)
        await pilot.pause()
        assert views(app, "assistant")[0].plain == text
        await keys(pilot, "f3")
        await pilot.pause(0.1)
        assert_renderable_is_safe(views(app, "assistant")[0].query_one(ReplyText).text)
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
