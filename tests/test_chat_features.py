"""Pilot tests of the message features: regenerate, replay at K = 0, edit and resend, copy.

Fake backends (fast, deterministic); each test fails if the feature it names breaks.
"""

from __future__ import annotations

from chatapp.chat.engine_time import ENGINE_BASIS
from chatapp.chat.history import HistoryStore
from chatapp.engine.events import TokenEvent
from chatapp.engine.stats import TurnStats
from chatapp.settings.config import Config
from chatapp.tui.keys import help_sections
from chatapp.tui.message_list import last_code_block
from chatapp.tui.widgets import MessageView
from tests.conftest import keys, ready, reply_done, send, tui_fake_factory, wait_for

SIZE = (120, 40)
WARM = Config(draft_length="3", drafter="model", seed=0, temperature=0.9)


def views(app, role: str | None = None) -> list[MessageView]:
    return [v for v in app.query(MessageView) if role is None or v.role == role]


def turn_text(session, index: int) -> str:
    return "".join(e.text for e in session.turns[index] if isinstance(e, TokenEvent))


def notified(app, text: str) -> bool:
    return any(text in n.message for n in app._notifications)


async def told(pilot, text: str) -> bool:
    """Whether the app notified ``text`` (notifications arrive as messages: wait a little)."""
    await wait_for(pilot, lambda: notified(pilot.app, text), what=f"the note {text!r}")
    return True


def stored(app, chat_id: int | None = None):
    return app.chat.history.messages(chat_id if chat_id is not None else app.chat.chat_id)


async def chat_once(pilot, text: str = "hi") -> None:
    await send(pilot, text)
    await reply_done(pilot)


async def test_f6_regenerates_the_last_reply_in_place(tui_make_app):
    app = tui_make_app(config=WARM)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "tell me")
        session = app.chat.session
        first = views(app, "assistant")[0].plain
        await keys(pilot, "f6")
        await wait_for(pilot, lambda: len(session.turns) == 2 and app.chat.turn is None,
                       what="the regenerated reply")
        await pilot.pause()
        assert [v.role for v in views(app)] == ["user", "assistant"]
        second = turn_text(session, 1)
        assert views(app, "assistant")[0].plain == second != first  # a new sample, T 0.9
        assert [(m.role, m.content) for m in stored(app)] == [("user", "tell me"),
                                                               ("assistant", second)]
        assert [m.content for m in app.chat.messages] == ["tell me", second]


async def test_shift_f6_regenerates_with_a_new_seed_saved_with_the_reply(tui_make_app):
    app = tui_make_app(config=WARM)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "tell me")
        await keys(pilot, "shift+f6")
        await wait_for(pilot, lambda: len(app.chat.session.turns) == 2 and app.chat.turn is None,
                       what="the regenerated reply")
        await pilot.pause()
        seed = stored(app)[1].meta["seed"]
        assert app.chat.session.seed == seed != 0
        assert await told(pilot, f"new seed {seed}")
        assert len(stored(app)) == 2


async def test_regenerate_without_a_reply_says_so(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await keys(pilot, "f6")
        assert await told(pilot, "no reply to regenerate")
        assert app.chat.turn is None
        assert app.chat.session.turns == []


async def test_f8_replays_the_reply_at_k0_and_keeps_the_speedup(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=60, delay_s=0.002))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "tell me")
        reply = views(app, "assistant")[0]
        text, target = reply.plain, app.chat.session._engine.target  # the fake's own
        calls_before = len(target.evaluate_calls)
        await keys(pilot, "f2", "f8")
        await wait_for(pilot, lambda: app.chat.replaying is None and reply.entry.replay,
                       timeout=20, what="the replay")
        await pilot.pause()
        replay = reply.entry.replay
        assert replay.tokens == reply.stats.tokens and replay.plain_tps > 0
        assert replay.speculative_tps > 0 and replay.speedup > 0
        # The target decoded alone: one evaluation per token (and the prompt), no draft.
        assert len(target.evaluate_calls) - calls_before >= replay.tokens
        panel = app.stats_panel.body.render().plain
        assert "plain replay:" in panel and "speculation:" in panel and "speedup" in panel
        assert ENGINE_BASIS in panel  # what the two rates compare
        assert replay.speculative_tps == reply.entry.engine_decode_tps
        assert reply.plain == text  # the reply itself stays as it was
        assert stored(app)[1].meta["replay"] == replay.to_json()
        assert stored(app)[1].content == text and len(stored(app)) == 2
        assert await told(pilot, "plain replay:")


SLOW = dict(max_tokens=60, delay_s=0.05)  # a replay that lasts long enough to act during it


async def replaying(pilot) -> None:
    """A reply, then its replay at K 0 started."""
    await ready(pilot)
    await chat_once(pilot, "tell me")
    await keys(pilot, "f8")
    assert pilot.app.chat.replaying is not None


async def stop_replay(pilot) -> None:
    await keys(pilot, "escape")
    await wait_for(pilot, lambda: pilot.app.chat.replaying is None, timeout=20, what="the stop")


async def test_escape_stops_a_replay_and_nothing_is_stored(tui_make_app):
    app = tui_make_app(tui_fake_factory(**SLOW))
    async with app.run_test(size=SIZE) as pilot:
        await replaying(pilot)
        await stop_replay(pilot)
        assert views(app, "assistant")[0].entry.replay is None
        assert "replay" not in stored(app)[1].meta and await told(pilot, "Replay stopped")


async def test_a_message_sent_during_a_replay_waits_in_the_box(tui_make_app):
    app = tui_make_app(tui_fake_factory(**SLOW))
    async with app.run_test(size=SIZE) as pilot:
        await replaying(pilot)
        await send(pilot, "next question")
        assert await told(pilot, "replay at K = 0 is running")
        assert app.chat_input.text == "next question" and len(app.chat.session.turns) == 1
        await stop_replay(pilot)


async def test_editing_a_past_message_replaces_later_turns_and_keeps_the_old_chat(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "first")
        await chat_once(pilot, "second")
        before = [(m.role, m.content) for m in stored(app)]
        await keys(pilot, "tab", "home", "e")  # the first message, edited
        assert app.chat_input.text == "first" and app.chat_view.editing is not None
        assert app.chat_input.cursor_location == (0, len("first"))  # ready to type on
        assert "editing" in str(app.query_one("#status").render())
        app.chat_input.text = "first, edited"
        await keys(pilot, "enter")
        await reply_done(pilot)
        assert [(v.role, v.plain) for v in views(app)][0] == ("user", "first, edited")
        assert len(views(app)) == 2
        new_reply = turn_text(app.chat.session, 2)
        assert [(m.role, m.content) for m in stored(app)] == [("user", "first, edited"),
                                                               ("assistant", new_reply)]
        # The chat as it was is its own chat in the history, whole.
        kept = [c for c in app.chat.history.list_chats() if c.title == "first (before edit)"]
        assert len(kept) == 1
        assert [(m.role, m.content) for m in stored(app, kept[0].id)] == before
        assert await told(pilot, "first (before edit)")


async def test_escape_cancels_an_edit_and_gives_back_what_was_typed(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "first")
        app.chat_input.text = "half a thought"
        await keys(pilot, "tab", "home", "e")
        assert app.chat_input.text == "first"
        await keys(pilot, "escape")
        # a loaded machine may take longer than keys' pause to handle the key
        await wait_for(pilot, lambda: app.chat_view.editing is None, what="the edit cancelled")
        assert app.chat_view.editing is None and app.chat_input.text == "half a thought"
        assert len(stored(app)) == 2 and app.chat.session.turns[1:] == []


async def test_c_copies_the_selected_message(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat_once(pilot, "copy me")
        reply = views(app, "assistant")[0].plain
        await keys(pilot, "tab", "end", "c")
        assert app.clipboard == reply != ""
        assert await told(pilot, "Copied the reply")
        await keys(pilot, "home", "c")
        assert app.clipboard == "copy me" and await told(pilot, "Copied your message")


CODE_REPLY = "Here:\n```python\nprint('one')\n```\nand better:\n~~~sh\necho two\nls\n~~~\nDone."


async def test_b_copies_the_last_code_block(tui_make_app, tmp_path):
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    chat = store.create_chat("code")
    store.add_message(chat, "user", "show code")
    store.add_message(chat, "assistant", CODE_REPLY, stats=TurnStats(tokens=9), meta={"k": "3"})
    store.close()
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await keys(pilot, "tab", "end", "b")
        assert app.clipboard == "echo two\nls"
        assert await told(pilot, "Copied the sh code block (2 lines)")
        await keys(pilot, "home", "b")  # the user's message has none
        assert app.clipboard == "echo two\nls" and await told(pilot, "no code block")


def test_last_code_block_finds_the_last_fenced_block() -> None:
    assert last_code_block(CODE_REPLY) == ("sh", "echo two\nls")
    assert last_code_block("```\nx = 1\n```") == ("", "x = 1")
    assert last_code_block("no code, just `inline`") is None
    cut = "cut short:\n```py\ndef f():\n    return"
    assert last_code_block(cut) == ("py", "def f():\n    return")


async def test_the_features_are_in_the_help_and_the_palette(tui_make_app):
    rows = {keys_: text for _, section in help_sections()[:3] for keys_, text in section}
    assert "Regenerate" in rows["F6"] and "new random seed" in rows["shift+F6"]
    assert "K 0" in rows["F8"] and "Copy" in rows["c"] and "code block" in rows["b"]
    assert "Edit" in rows["e"]
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {"Regenerate reply", "Regenerate with a new seed", "Replay at K = 0",
                "Edit message", "Copy message", "Copy code block"} <= titles
