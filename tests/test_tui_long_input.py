"""Issue 4, "nothing the user wrote is lost", for long input: a 200,000-character paste is sent
intact while the app stays responsive, a paste too long for the context goes back into the
message box, and the message box's document edits as Textual's own does for LF text. The other
awkward inputs are in tests/test_tui_robustness.py.
"""

from __future__ import annotations

import time

from chatapp.tui.widgets import Note
from tests.conftest import (
    keys,
    paste,
    ready,
    reply_done,
    stored,
    tui_fake_factory,
    views,
    wait_for,
)

SIZE = (120, 40)


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
