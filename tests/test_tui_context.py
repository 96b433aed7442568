"""Pilot tests of the context meter in the status line and of the overflow policy in the app
(fake backends): the meter's text and its warning class, the note where the model's view begins
(drop-oldest), a refused message that stays in the box (refuse)."""

from __future__ import annotations

import dataclasses
import threading

from chatapp.chat import mentions
from chatapp.chat.attachments import read_attachment
from chatapp.settings.config import Config
from chatapp.tui import status_line
from chatapp.tui.message_list import MessageList
from chatapp.tui.status_line import ContextMeter
from chatapp.tui.widgets import MessageView, Note
from tests.conftest import ready, reply_done, send, tui_fake_factory, wait_for

SIZE = (120, 40)
CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.0)


def meter(app) -> ContextMeter:
    return app.query_one("#context", ContextMeter)


def meter_text(app) -> str:
    return str(meter(app).render())


async def test_the_meter_counts_the_typed_text_and_warns_from_80_percent(tui_make_app):
    # n_ctx 200, max_tokens 40: the fake's prompt is "user: <text>\n" then "assistant: ",
    # 5 tokens and one per "the ".
    app = tui_make_app(tui_fake_factory(n_ctx=200, max_tokens=40))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: meter_text(app) == "ctx 5/200", what="the empty chat")
        assert not meter(app).has_class("-warning")
        app.chat_input.text = "the " * 154  # 159 tokens: 79.5%
        await wait_for(pilot, lambda: meter_text(app) == "ctx 159/200", what="the typed text")
        assert not meter(app).has_class("-warning")
        app.chat_input.text = "the " * 155  # 160 tokens: 80%
        await wait_for(pilot, lambda: meter_text(app) == "ctx 160/200", what="80%")
        assert meter(app).has_class("-warning")
        assert "160 of the 200 tokens" in str(meter(app).tooltip)
        app.chat_input.text = "the " * 20
        await wait_for(pilot, lambda: meter_text(app) == "ctx 25/200", what="shorter")
        assert not meter(app).has_class("-warning")
        await send(pilot, "the " * 20)
        await reply_done(pilot)  # the chat and the empty box: more than 25 tokens now
        used = app.chat.context_use("").used
        assert used > 25 and meter_text(app) == f"ctx {used}/200"


def marker_and_next(app) -> tuple[Note, object]:
    """The note where the model's view begins, and the widget after it."""
    children = list(app.query_one(MessageList).children)
    [marker] = [c for c in children if c.has_class("view-start")]
    assert isinstance(marker, Note) and marker.has_class("-warning")
    assert marker.render().plain.startswith(
        "Earlier messages are outside the model's view (context full)")
    return marker, children[children.index(marker) + 1]


async def test_drop_oldest_marks_where_the_models_view_begins(tui_make_app):
    # n_ctx 120, max_tokens 30: a prompt may have 90 tokens.
    app = tui_make_app(tui_fake_factory(n_ctx=120, max_tokens=30, delay_s=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "the first message is here")
        await reply_done(pilot)
        assert not app.query(".view-start") and app.chat.context_use("").left_out == 0
        await send(pilot, "the " * 40)  # with the first turn, over 90 tokens
        await wait_for(pilot, lambda: bool(app.query(".view-start")), what="the marker")
        assert app.chat.turn is not None  # the turn's plan put it there, while it streams
        _marker, following = marker_and_next(app)
        assert following.entry is app.chat.entries[2]  # the first turn is out of view
        await reply_done(pilot)
        left_out = app.chat.context_use("").left_out  # the next turn's view, once it is done
        assert left_out > 0 and len(app.query(MessageView)) == 4  # all still shown
        _marker, following = marker_and_next(app)
        assert following.entry is app.chat.entries[left_out]
        assert meter_text(app).endswith(f", {left_out} out of view")


async def test_refuse_keeps_the_text_and_says_how_many_tokens_are_over(tui_make_app):
    config = dataclasses.replace(CONFIG, overflow="refuse")
    app = tui_make_app(tui_fake_factory(n_ctx=120, max_tokens=30), config=config)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("the first message is here", "a second one"):
            await send(pilot, text)
            await reply_done(pilot)
        use = app.chat.context_use("the " * 30)
        assert use.over > 0 and use.left_out == 0
        await send(pilot, "the " * 30)
        await pilot.pause()
        assert app.chat_input.text == "the " * 30 and len(app.chat.entries) == 4
        notes = [n.render().plain for n in app.query(Note) if n.has_class("-error")]
        assert any(f"{use.over:,} more than the {use.room:,}" in n for n in notes)
        assert not app.query(".view-start")


async def test_the_meter_counts_a_typed_at_path_as_the_file_it_attaches(tui_make_app, tmp_path,
                                                                        monkeypatch):
    # ... reading the file in a thread of its own: a slow disk, or a file that is no file, must
    # not freeze the app while the user types
    readers: list[threading.Thread] = []
    reading = status_line.mentions_to_count

    def recording(text, where):
        readers.append(threading.current_thread())
        return reading(text, where)

    monkeypatch.setattr(status_line, "mentions_to_count", recording)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "add.py").write_text("def add(a, b):\n    return a + b\n" * 5)
    (folder / "big.py").write_text("the " * 100)
    monkeypatch.setattr(mentions, "METER_BYTES", 300)  # big.py is over it: counted as typed
    app = tui_make_app(tui_fake_factory(n_ctx=400, max_tokens=40), folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        typed = "explain @add.py please"
        app.chat_input.text = typed
        as_sent = app.chat.context_use(typed, [read_attachment("add.py", folder)])
        as_text = app.chat.context_use(typed)
        assert as_sent.used > as_text.used + 20  # the file's lines, not one word
        await wait_for(pilot, lambda: meter_text(app) == f"ctx {as_sent.used}/400",
                       what="the file counted")
        assert readers and threading.main_thread() not in readers
        app.chat_input.text = "explain @missing.py and @big.py"  # no file, or over the bound
        expected = app.chat.context_use("explain @missing.py and @big.py").used
        await wait_for(pilot, lambda: meter_text(app) == f"ctx {expected}/400",
                       what="the words counted as typed")

