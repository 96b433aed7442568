"""Long conversations: the automatic context window; long prompts read in chunks with progress
events, cancellable between chunks (the cache keeps what was read, so the next request pays only
for the rest), shown as "reading the prompt" in the live reply's header."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from chatapp.backends.context_size import MIN_AUTO_CONTEXT, auto_context, kv_bytes_per_token
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
from chatapp.settings.config import Config, ConfigError, load_config
from chatapp.settings.options import OPTIONS
from chatapp.tui.widgets import MessageView
from tests.conftest import ready, reply_done, send, tui_fake_factory, views, wait_for

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


def test_the_automatic_window_is_the_trained_context_as_far_as_its_cache_fits() -> None:
    per_token = kv_bytes_per_token(layers=28, kv_heads=2, embedding=1536, heads=12)
    assert per_token == 28 * 1024  # the Qwen2.5-Coder 1.5B target: 28 KiB a token
    gib = 1024**3
    assert auto_context(32768, per_token, 22 * gib) == 32768  # this machine: all of it
    assert auto_context(32768, per_token, 2 * gib) == 18432  # a quarter of 2 GiB: 18k
    assert auto_context(32768, per_token, 256 * 1024**2) == MIN_AUTO_CONTEXT  # never below
    assert auto_context(2048, per_token, 256 * 1024**2) == 2048  # a model trained on less
    assert auto_context(32768, per_token, None) == 32768


def test_n_ctx_is_auto_by_default_and_an_explicit_number_still_wins(tmp_path) -> None:
    assert Config().n_ctx == "auto" and Config().context_tokens is None
    assert Config(n_ctx=8192).context_tokens == 8192
    assert OPTIONS["n_ctx"].parse("auto") == "auto" and OPTIONS["n_ctx"].parse("8192") == 8192
    path = tmp_path / "config.toml"
    path.write_text('n_ctx = "auto"\n')
    assert load_config(path).n_ctx == "auto"
    path.write_text("n_ctx = 16384\n")
    assert load_config(path).context_tokens == 16384
    with pytest.raises(ConfigError, match="n_ctx must be >= 64 or auto"):
        Config(n_ctx="big")


async def test_the_app_shows_the_reading_of_a_long_prompt_until_the_reply_starts(
        tui_make_app) -> None:
    """engine -> conversation -> the live reply's header, on the app: a 1,100-token message on a
    slow fake target (0.3 s an evaluation)."""
    app = tui_make_app(tui_fake_factory(max_tokens=4, delay_s=0.3))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "the " * 1100)
        await wait_for(pilot, lambda: any("reading the prompt 512 / " in str(v.header.content)
                                          for v in views(app, "assistant")),
                       what="the prompt's progress in the header")
        await reply_done(pilot)
        header = str(views(app, "assistant")[-1].header.content)
        assert "reading" not in header and "4 tok" in header
