"""Presets and per-chat settings in the app (Pilot, fake backends): a preset chosen in the settings
screen fills its fields and is in force from the next reply, one chosen in the command palette
too; a chat reopens (the app started again, or from the chats screen) with its preset, its
settings and its attachments, with a note when its preset left the config; the command line's
settings win over the chat the app starts with."""

from __future__ import annotations

from textual.command import CommandPalette
from textual.widgets import Input, Select, TextArea

from chatapp.settings.config import Config, load_config
from chatapp.settings.presets import BUILTIN_PRESETS, CODE_PROMPT, Preset
from chatapp.tui.widgets import MessageView, Note
from tests.conftest import ADD_PY as CODE
from tests.conftest import open_settings, ready, reply_done, send, tui_fake_factory, wait_for

SIZE = (120, 40)


def status(app) -> str:
    return str(app.query_one("#status").render())


def chips(app) -> list[str]:
    return [str(label.render()) for view in app.query(MessageView)
            for label in view.query(".attachment-chip")]


def notes(app) -> list[str]:
    return [note.render().plain for note in app.query(Note)]


def factory():
    """Fake models that take the system prompt from the config, as the real loader does."""
    fake = tui_fake_factory()

    def make(config, progress):
        session = fake(config, progress)
        session.configure(session.settings, config.system_prompt)
        return session

    return make


async def test_choosing_a_preset_in_settings_fills_its_fields_and_applies_it(tui_make_app,
                                                                             tmp_path):
    app = tui_make_app(factory(), config_path=tmp_path / "config.toml")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        assert screen.query_one("#set-preset", Select).value == ""
        screen.query_one("#set-max_tokens", Input).value = "77"  # a field no preset sets
        screen.query_one("#set-preset", Select).value = "chat"
        await pilot.pause()
        assert screen.query_one("#set-temperature", Input).value == "0.7"
        assert screen.query_one("#set-top_k", Input).value == "40"
        assert screen.query_one("#set-draft_length", Input).value == "auto"
        assert screen.query_one("#set-drafter", Select).value == "ngram+model"
        screen.query_one("#set-preset", Select).value = "code"
        await pilot.pause()
        assert screen.query_one("#set-system_prompt", TextArea).text == CODE_PROMPT
        assert screen.query_one("#set-temperature", Input).value == "0.0"
        await pilot.press("ctrl+s")
        await ready(pilot)  # the drafter changed: the models load again
        assert (app.config.preset, app.config.max_tokens, app.config.top_k) == ("code", 77, 0)
        assert app.chat.session.system_prompt == CODE_PROMPT
        assert "│ code │" in status(app)
        # A new chat starts with the defaults; "Save as defaults" makes new ones.
        await pilot.press("ctrl+n")
        await ready(pilot)
        assert (app.config.preset, app.config.system_prompt) == ("", "")
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#set-preset", Select).value = "chat"
        await pilot.pause()
        await pilot.press("f8")
        await ready(pilot)
        assert load_config(tmp_path / "config.toml").preset == "chat"
        app.use_preset("code")
        await ready(pilot)
        await pilot.press("ctrl+n")
        await ready(pilot)
        assert (app.config.preset, app.config.temperature) == ("chat", 0.7)


async def test_a_preset_from_the_command_palette_is_in_force_for_the_next_reply(tui_make_app):
    app = tui_make_app(factory(), config=Config(drafter="ngram+model", seed=0))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {f"Preset: {p.name}" for p in BUILTIN_PRESETS} <= titles
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="palette")
        await pilot.press(*"Preset: chat")
        await pilot.pause(0.5)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.config.preset == "chat", what="the preset")
        assert app.chat.session.settings.sampling.temperature == 0.7
        assert app.chat.session.settings.sampling.top_k == 40
        await send(pilot, "hello")
        await reply_done(pilot)
        reply = app.chat.entries[-1]
        assert reply.meta["temperature"] == 0.7  # the reply was made with the preset's sampling


async def test_a_reopened_chat_keeps_its_preset_settings_and_attachment(tui_make_app, folder):
    app = tui_make_app(factory(), folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.use_preset("code")
        await ready(pilot)
        await send(pilot, "rename a in @src/add.py")
        await reply_done(pilot)
        first = app.chat.chat_id
        await pilot.press("ctrl+n")
        app.use_preset("chat")
        await send(pilot, "hello")
        await reply_done(pilot)
        assert app.config.preset == "chat"
        await app._chat_chosen(("open", first, None))  # as the chats screen opens it
        await pilot.pause()
        assert (app.config.preset, app.config.system_prompt) == ("code", CODE_PROMPT)
        await send(pilot, "and b?")
        await reply_done(pilot)
        assert app.chat.entries[-1].meta["temperature"] == 0.0
        app.apply_config(app.config.with_overrides(top_k=5))  # changed mid-chat: recorded
    # Started again (default settings): the app reopens the last chat used, as it was.
    reopened = tui_make_app(factory(), folder=folder)
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert reopened.chat.chat_id == first
        assert (reopened.config.preset, reopened.config.system_prompt,
                reopened.config.temperature, reopened.config.top_k) == (
            "code", CODE_PROMPT, 0.0, 5)
        assert reopened.chat.session.system_prompt == CODE_PROMPT
        assert chips(reopened) == ["📎 src/add.py (2 lines)"]
        assert reopened.chat.entries[0].attachments[0].text == CODE
        assert "│ code │" in status(reopened)


async def test_a_chat_whose_preset_left_the_config_reopens_with_its_settings_and_a_note(
        tui_make_app):
    terse = Preset("terse", (("system_prompt", "Be terse."), ("temperature", 0.4)))
    app = tui_make_app(factory(), config=Config(drafter="model", draft_length="3", seed=0,
                                     presets=(*BUILTIN_PRESETS, terse)).with_preset("terse"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)
    reopened = tui_make_app(factory())  # the config file no longer has "terse"
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (reopened.config.preset, reopened.config.system_prompt,
                reopened.config.temperature) == ("terse", "Be terse.", 0.4)
        assert any("preset 'terse', which is no longer in the config file" in text
                   for text in notes(reopened))
        await pilot.press("f4")
        await pilot.pause()
        select = reopened.screen.query_one("#set-preset", Select)
        shown = select.query_one("SelectCurrent #label").render()
        assert select.value == "terse" and str(shown) == "terse (no longer in the config)"


async def test_the_command_lines_settings_win_over_the_chat_the_app_starts_with(tui_make_app):
    app = tui_make_app(factory())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.use_preset("chat")
        await ready(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)
    started = tui_make_app(factory(), config=Config(drafter="model", draft_length="3", seed=0,
                                         temperature=0.2), given={"temperature": 0.2})
    async with started.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (started.config.preset, started.config.temperature, started.config.top_k) == (
            "chat", 0.2, 40)
        assert started.chat.session.settings.sampling.temperature == 0.2
        await pilot.press("ctrl+n")  # a new chat: the settings the app started with
        await pilot.pause()
        assert (started.config.preset, started.config.temperature, started.config.top_k) == (
            "", 0.2, 0)
