"""What a streaming reply costs the UI thread: it is shown at a pace, not per step, and the work
per token does not grow with the reply (Pilot and the reply widget, on fake models; no clock in
the assertions but the pace's own)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen

from chatapp.chat.events import TokenEvent, TokenSource
from chatapp.tui.chat_view import FRAMES_PER_S
from chatapp.tui.markdown_text import MarkdownRenderer
from chatapp.tui.reply_text import ReplyPart, ReplyText
from chatapp.tui.token_text import join_runs
from tests.conftest import ready, reply_done, send, step_events, views
from tests.test_tui_markdown import markdown_factory, spans

SIZE = (120, 40)
A, R, B, T = TokenSource.ACCEPTED, TokenSource.RESAMPLED, TokenSource.BONUS, TokenSource.TARGET


async def test_a_fast_reply_is_shown_at_the_pace_and_ends_as_rendered_token_by_token(
        tui_make_app, monkeypatch):
    shown: list[float] = []  # when the reply widget was given new text
    original = ReplyText.append

    def counted(widget: ReplyText, pieces) -> None:
        shown.append(time.monotonic())
        original(widget, pieces)

    monkeypatch.setattr(ReplyText, "append", counted)
    app = tui_make_app(markdown_factory(max_tokens=600, delay_s=0.001))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "a long one")
        await reply_done(pilot)
        body = views(app, "assistant")[0].body
        steps = step_events(app.chat.session)
        # Many steps a frame: at most FRAMES_PER_S a second, and one at the end.
        assert len(shown) < len(steps) / 2
        assert len(shown) <= (shown[-1] - shown[0]) * FRAMES_PER_S + 2
        # The same text, tints and Markdown as a reply rendered at every token.
        tokens = [(e.text, e.source) for e in app.chat.session.events
                  if isinstance(e, TokenEvent) and e.text]
        per_token = MarkdownRenderer(body.markdown_styles())
        for token in tokens:
            per_token.append([token])
        assert body.text.plain == per_token.text.plain
        assert spans(body.text) == spans(per_token.text)
        runs: list[tuple[str, TokenSource]] = []
        join_runs(runs, tokens)
        assert body.runs == runs
        assert "".join(part.text.plain for part in body.parts) == body.text.plain


SECTION = [("## A step\n\nSome **bold** text, `code` and more words ", A),
           ("that go on for a while.\n\n- one item\n- two *items*\n\n", R),
           ("```python\ndef step(x):\n    return x + 1  # done\n```\n\n", B),
           ("> a quote to end\n\n", T)]


def tokens(sections: int) -> list[tuple[str, TokenSource]]:
    """A reply of ``sections`` sections in tokens of three characters at most."""
    return [(text[i:i + 3], source) for text, source in SECTION * sections
            for i in range(0, len(text), 3)]


class OneReply(App[None]):
    CSS_PATH = str(Path(__file__).parent.parent / "chatapp" / "tui" / "specchat.tcss")

    def __init__(self, widget: ReplyText) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.widget


async def work_per_token(sections: int) -> dict[str, float]:
    """A reply streamed into a reply widget one token a frame: per token, the characters
    parsed as Markdown, the characters kept to be parsed again, the characters painted, and the
    screen's layouts."""
    work = {"parsed": 0, "kept": 0, "painted": 0, "layouts": 0}
    render_block, render = MarkdownRenderer.render_block, ReplyPart.render
    refresh_layout = Screen._refresh_layout

    def parsing(renderer, block):
        work["parsed"] += block.end - block.start
        return render_block(renderer, block)

    def painting(part):
        work["painted"] += len(part.text)
        return render(part)

    def laying_out(screen, *args, **kwargs):
        work["layouts"] += 1
        return refresh_layout(screen, *args, **kwargs)

    reply = tokens(sections)
    widget = ReplyText()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MarkdownRenderer, "render_block", parsing)
        patch.setattr(ReplyPart, "render", painting)
        patch.setattr(Screen, "_refresh_layout", laying_out)
        async with OneReply(widget).run_test(size=SIZE) as pilot:
            await pilot.pause()
            work.update(parsed=0, painted=0, layouts=0)
            for token in reply:
                widget.append([token])
                work["kept"] += len(widget._renderer.source)
                await pilot.pause(0)
                await pilot.pause(0)
    return {name: count / len(reply) for name, count in work.items()}


async def test_the_work_per_token_does_not_grow_with_the_reply(monkeypatch):
    # Completed blocks join parts of PART_SIZE characters at most: both replies fill several.
    monkeypatch.setattr(ReplyText, "PART_SIZE", 200)
    short, long = await work_per_token(3), await work_per_token(12)
    for name in short:
        assert long[name] <= short[name] * 1.25 + 1, (name, short, long)
    # A token that does not start a line is painted where it is, without a layout.
    assert long["layouts"] < 0.5


def test_steps_reach_the_app_at_most_once_an_interval_the_first_at_once() -> None:
    """``post_reply``: the prompt and the first step are posted at once (the first token is not
    held back), later steps at most once every ``interval_s`` (each message wakes the app's
    thread), the end at once; every event arrives, in order."""
    import threading
    import types

    from chatapp.backends.fake import FakeBackend
    from chatapp.chat.message import ChatMessage
    from chatapp.chat.session import ChatSession
    from chatapp.engine.events import DoneEvent, PromptEvent, StepEvent
    from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
    from chatapp.policy.fixed import FixedDraftLength
    from chatapp.tui.messages import post_reply

    session = ChatSession(SpeculativeEngine(FakeBackend()), GenerationSettings(max_tokens=30),
                          seed=0)
    _, stream = session.reply([ChatMessage("user", "the user asks")], FixedDraftLength(0))
    events = list(stream)
    steps = sum(isinstance(event, StepEvent) for event in events)
    turn = types.SimpleNamespace(cancel=threading.Event())
    held: list = []
    post_reply(events, turn, held.append, lambda: False, interval_s=3600.0)
    batches = [message.events for message in held]
    assert [event for batch in batches for event in batch] == events
    assert isinstance(batches[0][-1], PromptEvent)
    assert [isinstance(event, StepEvent) for event in batches[1]].count(True) == 1
    assert len(batches) == 3 and isinstance(batches[-1][-1], DoneEvent) and steps > 2
    every: list = []
    post_reply(events, turn, every.append, lambda: False)  # no interval: a message a step
    assert len(every) == len(batches) + steps - 1
