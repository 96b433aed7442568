"""Pilot tests of the chat app on fake backends: headless, fast, no real model."""

from __future__ import annotations

import threading

import pytest

from chatapp.backends.base import BackendError
from chatapp.chat.history import HistoryStore
from chatapp.engine.events import DoneEvent, TokenEvent, TokenSource
from chatapp.settings.config import Config
from chatapp.tui.chats_screen import ChatListScreen
from chatapp.tui.reply_text import ReplyText
from chatapp.tui.token_text import Legend, TokenText
from chatapp.tui.widgets import Note
from tests.conftest import (
    keys,
    ready,
    reply_done,
    send,
    step_events,
    tui_fake_factory,
    views,
    wait_for,
)

SIZE = (120, 40)


async def test_sending_shows_user_and_assistant_messages(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"hi")
        await keys(pilot, "enter")
        await reply_done(pilot)
        user, assistant = views(app)
        assert (user.role, user.plain) == ("user", "hi")
        assert assistant.role == "assistant"
        tokens = [e for e in app.chat.session.events if isinstance(e, TokenEvent)]
        assert assistant.plain == "".join(e.text for e in tokens) != ""
        assert assistant.finish_reason in ("stop", "length")
        assert app.chat_input.text == ""
        assert "ready" in str(app.query_one("#status").render())
        target = app.chat.session._engine.target  # the fake's own, to check it is released
    assert target.cached_tokens == ()  # the models are released when the app ends


async def test_enter_sends_and_ctrl_j_adds_a_newline(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.chat_input.text == "a\nb"
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert views(app, "user")[0].plain == "a\nb"


async def test_streamed_tokens_are_styled_by_source(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=80))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "tell me")
        await reply_done(pilot)
        widget = views(app, "assistant")[0].query_one(ReplyText)
        events = [e for e in app.chat.session.events if isinstance(e, TokenEvent) and e.text]
        assert {e.source for e in events} >= {TokenSource.ACCEPTED, TokenSource.RESAMPLED}

        # Every character of the reply lies in exactly one span, styled for its event's source.
        expected = [e.source.value for e in events for _ in e.text]
        actual = [None] * len(widget.text.plain)
        for span in widget.text.spans:
            for i in range(span.start, span.end):
                assert actual[i] is None
                actual[i] = span.style.meta["token"]
            source = TokenSource(span.style.meta["token"])
            assert span.style == widget.token_style(source)
        assert actual == expected
        assert widget.text.plain == "".join(e.text for e in events)

        # The four sources look different (a tint each), and the legend's squares show the same
        # colours.
        tints = {source: widget.token_style(source).bgcolor for source in TokenSource}
        assert None not in tints.values() and len(set(tints.values())) == len(TokenSource)
        legend = app.query_one(Legend)
        squares = {TokenSource(s.style.meta["token"]): (legend.plain[s.start:s.end], s.style.color)
                   for s in legend.render().spans if s.style.meta}
        assert squares == {source: ("■", tint) for source, tint in tints.items()}


async def test_token_text_appends_without_rebuilding(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await reply_done(pilot)
        widget = TokenText(views(app, "assistant")[0].body.runs)  # the colours without Markdown
        await app.mount(widget)
        await pilot.pause()
        text, spans = widget.text, list(widget.text.spans)
        assert len(spans) > 3
        widget.append([("more", TokenSource.TARGET), ("!", TokenSource.TARGET),
                       ("?", TokenSource.BONUS)])
        await pilot.pause()
        assert widget.text is text  # appended in place, not rebuilt
        assert widget.text.plain.endswith("more!?")
        end = len(widget.text)
        # One span per run of a source, exactly as a text built at once has.
        assert widget.text.spans[:len(spans) - 1] == spans[:-1]
        assert [(s.end, s.style.meta["token"]) for s in widget.text.spans[-2:]] == [
            (end - 1, "target"), (end, "bonus")]
        fresh = TokenText(widget.runs)
        await app.mount(fresh)
        await pilot.pause()
        assert [(s.start, s.end, s.style.meta["token"]) for s in fresh.render().spans] == [
            (s.start, s.end, s.style.meta["token"]) for s in widget.text.spans]


async def test_changing_k_mid_reply_reaches_the_engine(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.02, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        session = app.chat.session
        marks: list[tuple[int, int]] = []  # (steps the engine had yielded, K) at each key press
        change_k = app.action_draft_length

        def marked(delta: int) -> None:
            change_k(delta)
            marks.append((len(step_events(session)), app.chat.policy.budget().most))
            assert f"K {marks[-1][1]}" in str(app.query_one("#status").render())  # at once

        app.action_draft_length = marked
        await send(pilot, "a long one")
        await wait_for(pilot, lambda: len(step_events(session)) >= 3, what="three steps")
        await keys(pilot, "ctrl+up")
        await wait_for(pilot, lambda: len(step_events(session)) >= marks[-1][0] + 4, what="steps")
        await keys(pilot, "ctrl+down", "ctrl+down")
        await wait_for(pilot, lambda: len(step_events(session)) >= marks[-1][0] + 4, what="steps")
        await keys(pilot, "escape")
        await reply_done(pilot)
        steps = step_events(session)
        assert [k for _, k in marks] == [4, 3, 2]
        assert all(s.k == 3 for s in steps[:marks[0][0]])
        bounds = [n for n, _ in marks] + [len(steps)]
        for (n, k), end in zip(marks, bounds[1:]):
            # One step may have read K just before the key press; every later one sees the new K.
            assert all(s.k == k for s in steps[n + 1:end]), (k, [s.k for s in steps])
        assert views(app, "assistant")[0].k_label == "3→2"


async def test_the_k_keys_reach_the_conversation_and_the_status_shows_its_k(tui_make_app):
    """ctrl+↓ / alt+↑ are the conversation's ``adjust_draft_length`` (what it does with an
    adaptive policy: tests/test_chat.py), and the status line shows the K it returns at once."""
    app = tui_make_app(config=Config(draft_length="auto", drafter="model", seed=0))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        deltas: list[int] = []
        adjust = app.chat.adjust_draft_length

        def recorded(delta: int) -> int:
            deltas.append(delta)
            return adjust(delta)

        app.chat.adjust_draft_length = recorded
        k = app.chat.policy.current_k()
        assert f"K auto({k})" in str(app.query_one("#status").render())
        await pilot.press("ctrl+down")
        assert deltas == [-1] and f"K {k - 1} " in str(app.query_one("#status").render())
        await pilot.press("alt+up")
        assert deltas == [-1, 1] and f"K {k} " in str(app.query_one("#status").render())


def footer_offers(app, description: str) -> bool:
    """Whether the footer shows a key for ``description`` (a disabled key shows, dimmed)."""
    return any(active.binding.description == description
               for active in app.active_bindings.values())


async def test_escape_stops_the_reply_keeps_and_saves_it(tui_make_app, tmp_path):
    app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.03, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert not footer_offers(app, "Stop reply")  # nothing streams: nothing to stop
        await send(pilot, "stop me")
        await wait_for(pilot, lambda: len(step_events(app.chat.session)) >= 3, what="three steps")
        assert footer_offers(app, "Stop reply")
        await keys(pilot, "escape")
        await reply_done(pilot)
        assert not footer_offers(app, "Stop reply")
        reply = views(app, "assistant")[0]
        assert reply.finish_reason == "cancelled"
        assert reply.has_class("-stopped")
        assert "stopped" in str(reply.header.render())
        tokens = [e for e in app.chat.session.events if isinstance(e, TokenEvent)]
        assert 0 < len(tokens) < 2000
        assert reply.plain == "".join(e.text for e in tokens)
        chat_id = app.chat.chat_id
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    saved = store.messages(chat_id)
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].finish_reason == "cancelled"
    assert saved[1].content == reply.plain
    assert saved[1].stats.tokens == len(tokens)
    store.close()


async def test_history_is_saved_and_reopened_in_a_new_app(tui_make_app):
    first = tui_make_app()
    async with first.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first question")
        await reply_done(pilot)
        await send(pilot, "second question")
        await reply_done(pilot)
        before = [(v.role, v.plain, v.stats, v.finish_reason, v.k_label) for v in views(first)]
        runs = [v.query_one(ReplyText).runs for v in views(first, "assistant")]
    second = tui_make_app()
    async with second.run_test(size=SIZE) as pilot:
        await ready(pilot)
        # The latest chat is reopened at start, with its highlighting and stats.
        reopened = [(v.role, v.plain, v.stats, v.finish_reason, v.k_label) for v in views(second)]
        assert reopened == before
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert views(second) == []
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(second.screen, ChatListScreen)
        await pilot.press("enter")
        await pilot.pause()
        after = [(v.role, v.plain, v.stats, v.finish_reason, v.k_label) for v in views(second)]
        assert after == before
        assert [v.query_one(ReplyText).runs for v in views(second, "assistant")] == runs
        # The reopened conversation is the context of the next turn.
        await send(pilot, "third")
        await reply_done(pilot)
        plan_messages = [m.content for m in second.chat.messages]
        assert plan_messages[0] == "first question" and plan_messages[-2] == "third"


async def test_stats_panel_shows_the_turn_and_past_turns_keep_theirs(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await reply_done(pilot)
        await pilot.press("ctrl+down")  # K 2 for the second turn
        await send(pilot, "two")
        await reply_done(pilot)
        finals = [e.stats for turn in app.chat.session.turns for e in turn
                  if isinstance(e, DoneEvent)]
        await pilot.press("f2")
        await pilot.pause()
        panel = app.stats_panel
        assert panel.display
        stats, info = panel.shown
        assert stats == finals[1] and info.title == "Turn 2" and info.k_label == "2"
        text = panel.body.render().plain
        assert f"Drafted         {stats.drafted}" in text
        assert f"Accepted        {stats.accepted}  {stats.acceptance_rate:.1%}" in text
        assert f"{stats.mean_accepted_length:.2f} tokens" in text
        assert f"{stats.tokens_per_s:.1f}" in text
        for position, rate in enumerate(stats.per_position_accepted, 1):
            assert f"{position:>3} " in text and f"{rate:4.0%}" in text
        # Select the first reply with the keyboard: the panel shows its numbers.
        await pilot.press("tab")
        assert app.focused is app.message_list
        await pilot.press("home")
        await pilot.pause()
        stats, info = panel.shown
        assert stats == finals[0] and info.title == "Turn 1" and info.k_label == "3"
        await pilot.press("escape")  # back to the input; the panel follows the latest again
        await pilot.pause()
        assert app.focused is app.chat_input
        assert panel.shown[0] == finals[1]
        # A click selects too: the first user message means its reply, turn 1.
        await pilot.click(views(app, "user")[0])
        await pilot.pause()
        assert panel.shown[0] == finals[0]
        assert views(app, "user")[0].has_class("-selected")


async def test_a_target_only_turn_gives_the_measured_speedup(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await send(pilot, "one")
        await reply_done(pilot)
        assert "send a turn at K 0" in app.stats_panel.body.render().plain
        for _ in range(3):
            await pilot.press("ctrl+down")
        await send(pilot, "plain")
        await reply_done(pilot)
        assert app.chat.baseline_tps is not None
        assert "target-only baseline" in app.stats_panel.body.render().plain
        await pilot.press("ctrl+up", "ctrl+up")
        await send(pilot, "again")
        await reply_done(pilot)
        assert "vs target-only" in app.stats_panel.body.render().plain


async def test_a_loading_error_is_shown_and_the_typed_text_kept(tui_make_app):
    gate = threading.Event()
    error = BackendError("The target model file is missing. Install it with "
                         "`pip install '.[models]'`.")
    app = tui_make_app(tui_fake_factory(gate=gate, error=error))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"why")
        await pilot.press("enter")  # sent while loading: waits for the models
        await pilot.pause()
        assert app.chat_view.pending == "why"
        assert views(app, "user")[0].has_class("-queued")
        gate.set()
        await wait_for(pilot, lambda: app.load_error is not None, what="the load error")
        await pilot.pause()
        assert app.chat_input.text == "why"  # the message went back into the input
        assert views(app) == []
        note = app.query_one("#load-error", Note)
        assert "The target model file is missing" in note.render().plain
        assert "Traceback" not in note.render().plain
        assert "load failed" in str(app.query_one("#status").render())
        await pilot.press("enter")  # sending again keeps the text, says what to do
        await pilot.pause()
        assert app.chat_input.text == "why"


async def test_a_memory_error_while_loading_is_readable(tui_make_app):
    app = tui_make_app(tui_fake_factory(error=MemoryError()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"typed")
        await wait_for(pilot, lambda: app.load_error is not None, what="the load error")
        await pilot.pause()
        assert "Not enough memory" in app.query_one("#load-error", Note).render().plain
        assert app.chat_input.text == "typed"


async def test_a_message_sent_while_loading_goes_out_when_ready(tui_make_app):
    gate = threading.Event()
    app = tui_make_app(tui_fake_factory(gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "loading" in str(app.query_one("#status").render())
        await send(pilot, "early")
        assert app.chat_view.pending == "early" and app.chat_input.text == ""
        gate.set()
        await ready(pilot)
        await reply_done(pilot)
        assert [v.role for v in views(app)] == ["user", "assistant"]
        assert not views(app, "user")[0].has_class("-queued")
        assert views(app, "assistant")[0].plain


async def test_a_failed_reply_puts_the_text_back(tui_make_app, tmp_path):
    app = tui_make_app(tui_fake_factory(n_ctx=64))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        long_text = "the speculative draft token " * 20
        await send(pilot, long_text)
        await reply_done(pilot)
        assert app.chat_input.text == long_text
        assert views(app) == []
        notes = [n.render().plain for n in app.query(Note)]
        assert any("context window" in n for n in notes)
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    assert store.list_chats() == []
    store.close()


async def test_a_model_without_a_chat_template_is_announced_once(tui_make_app):
    app = tui_make_app(tui_fake_factory(chat_template=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("first", "second"):
            await send(pilot, text)
            await reply_done(pilot)
        notes = [n.render().plain for n in app.query(Note)]
        assert sum("no usable chat template" in n for n in notes) == 1


async def test_a_model_with_a_chat_template_gets_no_template_note(tui_make_app):
    app = tui_make_app(tui_fake_factory())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await reply_done(pilot)
        assert not any("chat template" in n.render().plain for n in app.query(Note))


@pytest.mark.parametrize("drafter, shown", [("model", "draft fake-draft → target"),
                                             ("ngram", "draft prompt lookup → target"),
                                             ("ngram+model", "draft prompt lookup + fake-draft →")])
async def test_the_header_says_who_drafts(tui_make_app, drafter, shown):
    app = tui_make_app(config=Config(draft="fake-draft", drafter=drafter, draft_length="3"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert shown in str(app.query_one("#status").render())
