"""Long prompts: read in chunks with progress events, cancellable between chunks (the cache keeps
what was read, so the next request pays only for the rest), shown as "reading the prompt" in
the live reply's header."""

from __future__ import annotations

import threading

import numpy as np

from chatapp.backends.fake import FakeBackend
from chatapp.chat.turns import Turn
from chatapp.engine.events import (
    DoneEvent,
    FinishReason,
    PromptEvent,
    PromptProgressEvent,
    TokenEvent,
)
from chatapp.engine.loop import PROMPT_CHUNK, GenerationSettings, SpeculativeEngine
from chatapp.tui.widgets import MessageView

LONG = [1 + i % 25 for i in range(2 * PROMPT_CHUNK + 100)]


def generate(engine: SpeculativeEngine, prompt: list[int],
             cancel: threading.Event | None = None):  # noqa: ANN201
    return engine.generate(prompt, GenerationSettings(max_tokens=4), np.random.default_rng(0),
                           cancel=cancel)


def test_a_long_prompt_is_read_in_chunks_with_progress_before_the_reply() -> None:
    target = FakeBackend(n_ctx=4096)
    events = list(generate(SpeculativeEngine(target), LONG))
    progress = [e for e in events if isinstance(e, PromptProgressEvent)]
    total = len(LONG) - 1  # the last token is fed with the first step
    assert [(e.done, e.total) for e in progress] == [
        (PROMPT_CHUNK, total), (2 * PROMPT_CHUNK, total), (total, total)]
    assert target.evaluate_calls[:3] == [PROMPT_CHUNK, PROMPT_CHUNK, total - 2 * PROMPT_CHUNK]
    first_other = next(i for i, e in enumerate(events) if not isinstance(e, PromptProgressEvent))
    assert first_other == 3 and isinstance(events[3], PromptEvent)


def test_a_short_prompt_has_no_progress_events() -> None:
    events = list(generate(SpeculativeEngine(FakeBackend()), LONG[:PROMPT_CHUNK]))
    assert not any(isinstance(e, PromptProgressEvent) for e in events)
    assert isinstance(events[0], PromptEvent)


def test_a_cancel_while_reading_stops_between_chunks_and_keeps_what_was_read() -> None:
    target = FakeBackend(n_ctx=4096)
    cancel = threading.Event()
    events = []
    for event in generate(SpeculativeEngine(target), LONG, cancel):
        events.append(event)
        if isinstance(event, PromptProgressEvent):
            cancel.set()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].finish_reason is FinishReason.CANCELLED
    assert not any(isinstance(e, TokenEvent) for e in events)
    assert list(target.cached_tokens) == LONG[:PROMPT_CHUNK]
    target.evaluate_calls.clear()
    list(generate(SpeculativeEngine(target), LONG))  # the next request reads the rest only
    assert target.evaluate_calls[0] == PROMPT_CHUNK


def test_the_live_reply_header_shows_how_much_of_the_prompt_is_read() -> None:
    turn = Turn([], "")
    view = MessageView("assistant", turn=turn)
    turn.apply(PromptProgressEvent(2048, 4600))
    assert "reading the prompt 2,048 / 4,600" in view._header_text()  # noqa: SLF001
    turn.apply(PromptEvent(4601, 3.0))
    assert "reading" not in view._header_text() and "…" in view._header_text()  # noqa: SLF001
