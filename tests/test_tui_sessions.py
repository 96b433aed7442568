"""The chat app through Textual's Pilot with fake models: loading and its failures, settings,
the chats screen, help, quitting and a history that fails (tests/test_tui_app.py: the chat
itself)."""

from __future__ import annotations

import threading

import pytest
from textual.widgets import Input, OptionList

from chatapp.backends.base import BackendError
from chatapp.chat.history import HistoryStore
from chatapp.tui.chats_screen import ChatListScreen, TitleDialog
from chatapp.tui.screens import HelpScreen, SettingsScreen, key_label
from chatapp.tui.widgets import Note
from tests.conftest import (
    keys,
    open_settings,
    ready,
    reply_done,
    send,
    step_events,
    tui_fake_factory,
    views,
    wait_for,
)

SIZE = (120, 40)


async def test_auto_scroll_follows_only_at_the_bottom(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=1500, delay_s=0.002, endless=True))
    async with app.run_test(size=(60, 20)) as pilot:
        await ready(pilot)
        await send(pilot, "long")
        conversation = app.message_list
        await wait_for(pilot, lambda: conversation.max_scroll_y > 5, what="overflow")
        await pilot.pause(0.05)
        assert conversation.scroll_y == pytest.approx(conversation.max_scroll_y, abs=2)
        conversation.scroll_home(animate=False)
        await pilot.pause(0.02)
        height = conversation.max_scroll_y
        await wait_for(pilot, lambda: conversation.max_scroll_y > height + 3, what="growth")
        assert conversation.scroll_y == 0  # the user scrolled up: left alone
        conversation.scroll_end(animate=False)  # back at the bottom: followed again
        await pilot.pause(0.02)
        height = conversation.max_scroll_y
        await wait_for(pilot, lambda: conversation.max_scroll_y > height + 3, what="growth")
        await pilot.pause(0.02)
        assert conversation.scroll_y == pytest.approx(conversation.max_scroll_y, abs=2)
        await keys(pilot, "escape")
        await reply_done(pilot)


async def test_settings_change_sampling_and_k(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        screen.query_one("#set-temperature").value = "0.7"
        screen.query_one("#set-draft_length").value = "5"
        screen.query_one("#set-system_prompt").text = "Be brief."
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.chat.session.settings.sampling.temperature == 0.7
        assert app.chat.session.system_prompt == "Be brief."
        assert app.chat.policy.budget().most == 5
        status = str(app.query_one("#status").render())
        assert "T 0.7" in status and "K 5" in status
        # A bad value is explained in the dialog, which stays open.
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#set-top_p").value = "2"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "top_p" in str(app.screen.query_one("#settings-error").render())


async def test_new_chat_delete_and_export(tui_make_app, tmp_path):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "keep this")
        await reply_done(pilot)
        first_chat = app.chat.chat_id
        await pilot.press("f9")
        await pilot.pause()
        exported = tmp_path / "exports" / f"specchat-{first_chat}-keep-this.md"
        assert exported.is_file()
        assert "## You\n\nkeep this" in exported.read_text()
        assert any(str(exported) in n.message for n in app._notifications)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert views(app) == [] and app.chat.chat_id is None
        await send(pilot, "another")
        await reply_done(pilot)
        assert app.chat.chat_id != first_chat
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert len(app.chat.history.list_chats()) == 2
        await pilot.press("d", "d")  # the open chat is highlighted: delete it
        await pilot.pause()
        assert [c.id for c in app.chat.history.list_chats()] == [first_chat]
        await pilot.press("escape")
        await pilot.pause()
        assert app.chat.chat_id is None and views(app) == []


async def test_r_in_the_chats_screen_renames_the_highlighted_chat(tui_make_app):
    """ctrl+o, then r: a dialog holding the chat's title; Enter gives the chat the typed title
    (the list and the history show it), Esc and an empty title keep the old one."""
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "name me later")
        await reply_done(pilot)
        chat_id = app.chat.chat_id
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, TitleDialog)
        assert app.screen.query_one(Input).value == "name me later"
        await pilot.press("end", "ctrl+u", *"Trip plans", "enter")
        await pilot.pause()
        chats = app.screen
        assert isinstance(chats, ChatListScreen)
        assert app.chat.chats.get(chat_id).title == "Trip plans"
        listed = chats.query_one(OptionList).get_option_at_index(0).prompt
        assert listed.plain.startswith("Trip plans  (open)")
        assert "Renamed to Trip plans." in str(chats.query_one("#chats-status").render())
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("end", "ctrl+u", *"Other", "escape")
        await pilot.pause()
        assert app.screen is chats and app.chat.chats.get(chat_id).title == "Trip plans"
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("end", "ctrl+u", "enter")
        await pilot.pause()
        assert app.screen is chats and app.chat.chats.get(chat_id).title == "Trip plans"
        assert "needs a title" in str(chats.query_one("#chats-status").render())


async def test_help_lists_every_binding(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys_shown = [k for _, rows in app.screen.sections for k, _ in rows]
        for binding in app.BINDINGS:
            assert key_label(binding.key) in keys_shown
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("tab", "question_mark")  # "?" from the messages (not the input)
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


async def test_quitting_while_loading_waits_for_the_load_and_says_so(tui_make_app):
    gate = threading.Event()
    app = tui_make_app(tui_fake_factory(gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+q")
        assert app.is_running
        assert "Quitting when the models have loaded" in str(
            app.query_one("#loading-text").render())
        gate.set()
        await wait_for(pilot, lambda: not app.is_running, what="the exit")


async def test_escape_takes_back_a_message_waiting_for_the_models(tui_make_app):
    gate = threading.Event()
    app = tui_make_app(tui_fake_factory(gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "never mind")
        assert app.chat_view.pending == "never mind"
        await pilot.press("escape")
        assert app.chat_view.pending is None and views(app) == []
        assert app.chat_input.text == "never mind"
        gate.set()
        await ready(pilot)
        assert views(app) == []


async def test_changing_the_models_in_settings_reloads_them(tui_make_app):
    calls = []
    good = tui_fake_factory()

    def factory(config, progress):
        calls.append(config.target)
        if config.target == "no-such-model":
            raise BackendError("Unknown model 'no-such-model'. See `specchat models`.")
        return good(config, progress)

    app = tui_make_app(factory)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = app.chat.session
        await pilot.press("f4")
        app.screen.query_one("#set-target").value = "no-such-model"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.load_error is not None, what="the load error")
        assert app.chat.session is None
        assert "Unknown model 'no-such-model'" in app.query_one("#load-error", Note).render().plain
        await pilot.press("f4")
        app.screen.query_one("#set-target").value = "fake-target"
        await pilot.press("ctrl+s")
        await ready(pilot)
        assert app.chat.session is not first and app.load_error is None
        assert not app.query("#load-error")
        assert "target fake-target" in str(app.query_one("#status").render())
        assert calls[1:] == ["no-such-model", "fake-target"]
        second = app.chat.session
        await pilot.press("f4")
        app.screen.query_one("#set-draft_backend").value = "hf"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.chat.session not in (None, second), what="the reload")
        assert app.config.draft_backend == "hf" and len(calls) == 4


async def test_a_new_chat_mid_reply_stops_it_and_saves_it_to_its_own_chat(tui_make_app):
    app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.01, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "old chat")
        old_chat = app.chat.chat_id
        await wait_for(pilot, lambda: len(step_events(app.chat.session)) >= 3, what="three steps")
        await keys(pilot, "ctrl+n")
        await wait_for(pilot, lambda: views(app) == [], what="the empty chat")
        assert app.chat.chat_id is None
        await reply_done(pilot)
        assert views(app) == [] and app.chat.messages == []
        saved = app.chat.history.messages(old_chat)
        assert [(m.role, m.finish_reason) for m in saved] == [("user", None),
                                                              ("assistant", "cancelled")]
        await send(pilot, "new chat")
        await wait_for(pilot, lambda: len(app.chat.session.turns) == 2, what="the second reply")
        await keys(pilot, "escape")
        await reply_done(pilot)
        assert app.chat.chat_id != old_chat
        assert [m.content for m in app.chat.messages][:1] == ["new chat"]


async def test_quitting_mid_reply_saves_the_partial_reply(tui_make_app, tmp_path):
    app = tui_make_app(tui_fake_factory(max_tokens=2000, delay_s=0.01, endless=True))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "quit on me")
        await wait_for(pilot, lambda: len(step_events(app.chat.session)) >= 3, what="three steps")
        chat_id = app.chat.chat_id
        await keys(pilot, "ctrl+q")
    store = HistoryStore(tmp_path / "data" / "history.sqlite3")
    saved = store.messages(chat_id)
    assert [(m.role, m.finish_reason) for m in saved] == [("user", None),
                                                          ("assistant", "cancelled")]
    assert saved[1].content and saved[1].stats.tokens > 0
    store.close()


async def test_a_history_that_cannot_be_written_does_not_stop_the_chat(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.chat.history._db.close()  # as if the disk went away
        await send(pilot, "still works")
        await reply_done(pilot)
        assert [v.role for v in views(app)] == ["user", "assistant"]
        assert views(app, "assistant")[0].plain
        assert any("Could not save to the history" in n.message for n in app._notifications)


async def test_a_history_that_cannot_be_opened_is_reported(tui_make_app, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    app = tui_make_app(history_path=blocker / "history.sqlite3")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.chat.history is None
        assert any("cannot be opened" in n.message for n in app._notifications)
        await send(pilot, "unsaved")
        await reply_done(pilot)
        assert views(app, "assistant")[0].plain
