"""Replies as Markdown with the tokens' provenance, through Pilot on fake models: streamed as
rendered at once, F3 turns the tints off and on, a theme change restyles."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.console import Console
from rich.text import Text

from chatapp.chat.reply_settings import generation_settings
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.loop import SpeculativeEngine
from chatapp.settings.config import Config
from chatapp.tui.markdown_text import render_markdown
from chatapp.tui.reply_text import ReplyPart, ReplyText
from chatapp.tui.token_text import Legend
from tests.conftest import (
    EndlessFakeBackend,
    RecordingSession,
    keys,
    ready,
    reply_done,
    send,
    views,
    wait_for,
)

SIZE = (120, 40)
CONSOLE = Console(color_system="truecolor")


class MarkdownFakeBackend(EndlessFakeBackend):
    """A fake model some of whose tokens are Markdown: its replies are full of fences, markers
    and emphasis, opened and closed anywhere."""

    PIECES: ClassVar[dict[int, str]] = {
        1: "**", 2: "`", 3: "\n```python\n", 4: "\n# ", 5: "\n- ", 6: "\n```\n", 7: "def ",
        8: "*", 9: "\n> ", 10: "\n---\n", 11: "\x1b[31m", 12: "\r\n", 13: "_", 14: "[a](b)"}

    def token_bytes(self, token: int) -> bytes:
        piece = self.PIECES.get(token)
        return piece.encode() if piece is not None else super().token_bytes(token)


def markdown_factory(max_tokens: int, delay_s: float = 0.0):
    def factory(config: Config, progress) -> RecordingSession:
        engine = SpeculativeEngine(MarkdownFakeBackend(delay_s=delay_s),
                                   ModelDrafter(MarkdownFakeBackend(noise=1.0)))
        settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        return RecordingSession(engine, settings, seed=0)

    return factory


def spans(text: Text) -> list[tuple[int, int, str, str | None]]:
    """(start, end, style, token) of each span of ``text``."""
    return [(s.start, s.end, str(s.style), s.style.meta.get("token")) for s in text.spans]


def shown(widget: ReplyText) -> list[tuple[int, int, str, str | None]]:
    """The spans of what the widget shows."""
    return spans(widget.text)


def backgrounds(widget: ReplyText) -> set:
    text = widget.text
    return {text.get_style_at_offset(CONSOLE, i).bgcolor for i in range(len(text))}


async def first_reply(pilot, app) -> ReplyText:
    """Once the app is ready, "x" sent and answered: the reply's text."""
    await ready(pilot)
    await send(pilot, "x")
    await reply_done(pilot)
    return views(app, "assistant")[0].body


async def test_a_markdown_reply_streams_into_the_same_text_as_rendered_at_once(tui_make_app):
    app = tui_make_app(markdown_factory(max_tokens=400, delay_s=0.002))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "markdown please")
        reply = views(app, "assistant")[-1]
        compared = 0
        while app.chat.turn is not None:  # mid-stream: the same as the text so far at once
            await pilot.pause(0.02)
            at_once = render_markdown(reply.body.runs, reply.body.markdown_styles())
            streamed = reply.body.text
            assert at_once.plain == streamed.plain
            assert spans(at_once) == spans(streamed)
            compared += 1
        await reply_done(pilot)
        text = reply.body.text
        for marker in ("```", "**", "\x1b", "> "):
            assert marker in reply.plain  # the fake really wrote Markdown (and an ESC)
        assert "\x1b" not in text.plain and "␛[31m" in text.plain
        assert len(text.plain) < len(reply.plain)  # markers left out
        assert compared >= 2
        # Every shown character lies in exactly one span with its token's meta.
        owners = [0] * len(text)
        for span in text.spans:
            if span.style.meta:
                for index in range(span.start, span.end):
                    owners[index] += 1
        assert set(owners) == {1}


async def test_f3_turns_the_tints_off_and_on_and_the_legend_says_so(tui_make_app):
    app = tui_make_app(markdown_factory(max_tokens=120))
    async with app.run_test(size=SIZE) as pilot:
        reply = await first_reply(pilot, app)
        legend = app.query_one(Legend)
        tinted, tinted_spans = reply.text.plain, shown(reply)
        tints = {reply.token_style(source).bgcolor for _, source in reply.runs}
        assert tints <= backgrounds(reply) and len(tints) > 1
        assert "■" in legend.plain and "F3 hides" in legend.plain
        await keys(pilot, "f3")
        await pilot.pause()
        assert backgrounds(reply) == {None}  # no tint left
        assert reply.text.plain == tinted  # the same Markdown
        assert [(a, b, token) for a, b, _, token in shown(reply) if token] == [
            (a, b, token) for a, b, _, token in tinted_spans if token]
        assert "F3 shows token colours" in legend.plain and "■" not in legend.plain
        await send(pilot, "again")  # a reply that starts with the tints off
        await reply_done(pilot)
        assert backgrounds(views(app, "assistant")[1].body) == {None}
        await keys(pilot, "f3")
        await pilot.pause()
        assert shown(reply) == tinted_spans and "■" in legend.plain
        assert len(backgrounds(views(app, "assistant")[1].body)) > 1


async def test_a_theme_change_restyles_the_reply(tui_make_app):
    app = tui_make_app(markdown_factory(max_tokens=120))
    async with app.run_test(size=SIZE) as pilot:
        reply = await first_reply(pilot, app)
        dark = backgrounds(reply)
        app.theme = "textual-light" if app.current_theme.dark else "textual-dark"
        await wait_for(pilot, lambda: backgrounds(reply) != dark, what="the new tints")
        assert not backgrounds(reply) & dark


async def test_completed_blocks_are_painted_once_not_at_every_step(tui_make_app, monkeypatch):
    renders: dict[int, int] = {}
    original = ReplyPart.render

    def counted(part):
        renders[id(part)] = renders.get(id(part), 0) + 1
        return original(part)

    monkeypatch.setattr(ReplyPart, "render", counted)
    monkeypatch.setattr(ReplyText, "PART_SIZE", 300)
    app = tui_make_app(markdown_factory(max_tokens=1500, delay_s=0.002))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "a long one")
        reply = views(app, "assistant")[0]
        full = None  # the first part's renders when it was full (a part after it)
        while app.chat.turn is not None:
            await pilot.pause(0.01)
            parts = reply.body.parts
            if full is None and len(parts) >= 3:  # a completed part after it, then the live one
                full = renders[id(parts[0])]
        await reply_done(pilot)
        body = reply.body
        assert full is not None and len(body.parts) > 2
        assert "".join(part.text.plain for part in body.parts) == body.text.plain
        # not painted again as the reply went on (a relayout or two under load at most)
        assert renders[id(body.parts[0])] <= full + 3
        assert renders[id(body.parts[-1])] > 20  # the live part: at every frame
