"""The chat app: the screen (status line, chat view, stats panel, footer), the keys that act on
it, the saved chats, the models' loading and the ways out.

The app renders what its conversation (``chatapp.chat.conversation.Conversation``, ``self.chat``)
holds and forwards the user's keys to it; it never calls a model, a drafter or the history
itself: the saved chats are the conversation's ``chats``. The chat view (``chat_view.ChatView``)
owns the messages, the message box and the reply streaming; the app calls it and hears from it
through messages (``ChatView.Changed``; the loader's ``LoadProgress``, ``SessionLoaded``,
``LoadFailed``). The session comes from ``session_factory(config, progress)`` (by default
``chatapp.assembly.loader.build_session_over_history``) in a worker thread; tests pass fake ones.

Every way out (ctrl+q, the terminal closed, the system asking, a crash) stops and saves a
streaming reply (stopped) and closes the models and the history.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, TextArea

from chatapp.assembly.loader import LoadProgress as ProgressCallback
from chatapp.assembly.loader import build_session_over_history
from chatapp.chat.context import ContextUse
from chatapp.chat.conversation import Conversation
from chatapp.chat.session import ChatSession
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config
from chatapp.tui.chat_input import ChatInput
from chatapp.tui.chat_view import ChatView
from chatapp.tui.chats_screen import ChatChoice, ChatListScreen, export_markdown
from chatapp.tui.file_picker import FilePickerScreen
from chatapp.tui.keys import BINDINGS, help_sections, system_commands
from chatapp.tui.loading import ModelLoader, SessionFactory
from chatapp.tui.message_list import MessageList
from chatapp.tui.messages import LoadFailed, LoadProgress, SessionLoaded
from chatapp.tui.screens import HelpScreen, SettingsScreen
from chatapp.tui.shutdown import QuitSignals, quit_on_signal
from chatapp.tui.status_line import ContextMeter, StatusBar
from chatapp.tui.widgets import StatsPanel


class SpecChatApp(App[int]):
    """specchat's chat app. ``config_path`` is the file the settings screen saves to (None: the
    default place); ``folder`` the one ``@path`` words and the file picker start from (None: the
    current one); ``given`` the settings the command line gave, over those of the chat the app
    reopens at its start. ``session_factory``, ``history_path`` and ``export_dir`` are there
    for tests (fake backends, a temporary database)."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = BINDINGS

    def __init__(self, config: Config, *, config_path: Path | None = None,
                 session_factory: SessionFactory | None = None,
                 history_path: Path | None = None, export_dir: Path | None = None,
                 folder: Path | None = None, given: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._given = given or {}
        self._defaults = config  # what a new chat starts with (Save as defaults changes it)
        self.folder = folder or Path.cwd()
        self.config_path = config_path
        self.session_factory: SessionFactory = session_factory or self._build_session
        self.history_path = history_path
        self.export_dir = export_dir
        self.chat = Conversation(config, None, on_write_error=self._history_write_failed)
        self.told_notes: list[str] = []  # the sessions' runtime notes shown so far, in order
        self._view: ChatView | None = None
        self._meter = ContextMeter(id="context")  # counts once typing pauses; not while closing
        self._quit_when_loaded = False
        self._signals = QuitSignals()

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="top"):
            yield StatusBar(id="status")
            yield self._meter
        with Horizontal(id="body"):
            self._view = ChatView(self.chat, self.session_factory, folder=self.folder,
                                  id="main")
            yield self._view
            yield StatsPanel(id="stats")
        yield Footer()

    @property
    def config(self) -> Config:
        return self.chat.config

    @property
    def chat_view(self) -> ChatView:
        assert self._view is not None, "the app is not composed yet"
        return self._view

    @property
    def message_list(self) -> MessageList:
        return self.chat_view.message_list

    @property
    def chat_input(self) -> ChatInput:
        return self.chat_view.chat_input

    @property
    def loader(self) -> ModelLoader:
        return self.chat_view.loader

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one("#stats", StatsPanel)

    def _build_session(self, config: Config, progress: ProgressCallback) -> ChatSession:
        return build_session_over_history(config, progress, self.history_path)

    async def on_mount(self) -> None:
        self._signals.install(lambda signum: quit_on_signal(self, signum))
        try:
            self.chat.chats.open(self.history_path)
        except UserFacingError as error:
            self.notify(f"{error} Chats of this session will not be saved.",
                        title="No history", severity="error", timeout=15, markup=False)
        self.message_list.anchor()
        self.stats_panel.show_nothing()
        await self.reopen(self.chat.chats.latest())  # where the user left off
        self.start_loading()

    def _history_write_failed(self, text: str) -> None:
        if self.is_running:
            self.notify(text, severity="error", timeout=10, markup=False)

    # -- what the chat view says ----------------------------------------------------------------

    def update_status(self) -> None:
        view = self.chat_view
        self.query_one("#status", StatusBar).show(self.chat, view.loader,
                                                  view.editing is not None)

    def update_context(self, marker: bool = True) -> None:
        """The context meter follows the chat and the message box (see ``ContextMeter``)."""
        def mark(use: ContextUse) -> None:  # where the model's view begins
            if marker:
                self.message_list.mark_view_start(self.chat.entries, use.left_out)

        self._meter.follow(self.chat, self.chat_input.text, self.folder, mark)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if (box := event.text_area).id == "input" and self.is_running and self._meter.is_attached:
            self._meter.later(box, lambda: self.update_context(False))

    def on_chat_view_changed(self, message: ChatView.Changed) -> None:
        if self.is_running:  # closing: the widgets may be gone already
            self._follow_view(message.step)

    def _follow_view(self, step: bool = False) -> None:
        """The status line, the stats and (unless only a step was shown) the footer's keys show
        what the chat view holds. The view's ``Changed`` asks for this; a key's action also
        does it at once, so that the screen never waits for that message to show the key's
        effect."""
        self.update_status()
        if not step:
            self.refresh_bindings()
            self.update_context()
        self._refresh_stats()

    def on_message_list_selection_changed(self) -> None:
        if self.is_running:
            self._refresh_stats()

    def _refresh_stats(self) -> None:
        """The stats panel shows the selected reply, else the live one, else the latest."""
        panel = self.stats_panel
        shown = self.message_list.reply_stats() if panel.display else None
        if shown is not None:
            panel.show(*shown, self.chat.baseline_tps)
        elif panel.display:
            panel.show_nothing()

    # -- the models -----------------------------------------------------------------------------

    def start_loading(self) -> None:
        self.chat_view.start_loading()
        self.update_status()

    @property
    def load_error(self) -> str | None:
        """Why the last load failed; None while loading and once loaded."""
        return self.loader.error

    @property
    def is_loading(self) -> bool:
        return self.chat.session is None and self.load_error is None

    def on_load_progress(self, message: LoadProgress) -> None:
        if self.is_running:
            self.update_status()

    def on_session_loaded(self, message: SessionLoaded) -> None:
        if not self.is_running:
            message.session.close()
            return
        self.chat.attach(message.session)
        if self._quit_when_loaded:
            self.exit()
            return
        for note in message.session.notes:  # once per app run, and on stderr at the exit
            if note not in self.told_notes:
                self.told_notes.append(note)
                self.chat_view.add_note(note)
        self._follow_view()
        self.chat_view.models_loaded()

    def on_load_failed(self, message: LoadFailed) -> None:
        if not self.is_running:
            return
        if self._quit_when_loaded:
            self.exit()
            return
        self.chat_view.load_failed(message.error)
        self.update_status()

    def action_reload(self) -> None:
        if self.chat.busy:
            self.notify("Stop the reply first (Esc), then reload.", severity="warning")
            return
        self.chat.release()
        self.start_loading()

    # -- keys -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Esc stops something only while there is something to stop (a reply, a replay, a
        queued message, an edit): else the footer does not offer it."""
        if action == "stop":
            view = self._view
            waiting = view is not None and (view.pending is not None or view.editing is not None)
            return self.chat.busy or waiting
        return True

    def action_stop(self) -> None:
        self.chat_view.stop()
        self._follow_view()

    def action_regenerate(self, new_seed: bool = False) -> None:
        self.chat_view.regenerate(new_seed)
        self._follow_view()

    def action_replay(self) -> None:
        self.chat_view.replay()
        self._follow_view()

    def action_edit_message(self) -> None:
        self.chat_view.edit_message()
        self._follow_view()

    def action_draft_length(self, delta: int) -> None:
        k = self.chat.adjust_draft_length(delta)
        if self.chat.session is not None and not self.chat.has_drafter and k > 0:
            self.notify("No draft model is loaded, so the target decodes alone. Reload with a "
                        "draft model (F4) to speculate.", severity="warning")
        self.update_status()
        self._refresh_stats()

    def set_draft_length(self, k: int) -> None:
        self.chat.set_draft_length(k)
        self.update_status()

    def set_auto_draft_length(self) -> None:
        self.chat.set_auto_draft_length()
        self.update_status()

    def action_toggle_stats(self) -> None:
        panel = self.stats_panel
        panel.display = not panel.display
        self._refresh_stats()

    def action_toggle_highlight(self) -> None:
        self.chat_view.set_highlighting(not self.chat_view.highlight)

    def action_attach_file(self) -> None:
        """Pick a file in a tree of the start folder; its ``@path`` goes in at the cursor."""
        def picked(path: str | None) -> None:
            if path is not None:
                self.chat_input.insert_mention(path)
            self.chat_input.focus()

        self.push_screen(FilePickerScreen(self.folder), picked)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_sections()))

    def action_settings(self) -> None:
        screen = SettingsScreen(self.config, self.config_path)
        self.push_screen(screen, lambda config: self.apply_config(config, defaults=screen.saved))

    def use_preset(self, name: str) -> None:
        """Answer with the preset ``name``'s settings from the next reply on."""
        self.apply_config(self.config.with_preset(name), f"Preset {name}: from the next reply.")

    def apply_config(self, config: Config | None, told: str = "Settings applied from the next "
                     "reply.", defaults: Config | None = None) -> None:
        """Answer with ``config`` from the next reply on (``told`` says so), reloading if need
        be; ``defaults``: what new chats start with from now on (None: as they did)."""
        self._defaults = defaults or self._defaults
        if config is None or config == self.config:
            return
        if not self.chat.reconfigure(config):
            self.notify(told, timeout=3, markup=False)
        elif self.chat.busy:
            self.notify("The new models load after this reply: press ctrl+r then.",
                        severity="warning")
        else:
            self.action_reload()
        self._follow_view()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from system_commands(self)

    # -- saved chats ----------------------------------------------------------------------------

    async def action_new_chat(self) -> None:
        await self.reopen(None)
        self._follow_view()

    def action_chats(self) -> None:
        chats = self.chat.chats
        if not chats.available:
            self.notify("The history is not available in this session.", severity="error")
            return
        self.push_screen(ChatListScreen(chats, self.chat.chat_id, self.export_dir),
                         self._chat_chosen)

    async def _chat_chosen(self, result: ChatChoice | None) -> None:
        """Open the chosen chat (at the message a search found), or a new one."""
        chat_id = self.chat.chat_id
        deleted = chat_id is not None and not self.chat.chats.exists(chat_id)
        if result is not None and result[0] == "open":
            await self.reopen(result[1], result[2])
        elif deleted or result is not None:  # a new chat, or the open one was deleted
            await self.reopen(None)
        self._follow_view()

    async def reopen(self, chat_id: int | None, at: int | None = None) -> None:
        """Open saved chat ``chat_id`` (at message ``at``) with its recorded settings (at the
        start the command line's over them); None: a new chat, on the defaults (``_defaults``)."""
        await self.chat_view.open_chat(chat_id)
        if at is not None:
            self.message_list.show_message(at)
        base = self.config if chat_id is not None else self._defaults
        config, note = self.chat.chats.reopened(chat_id, base, self._given)
        self._given = {}
        if note:
            self.chat_view.add_note(note)
        if self.chat.session is None:  # the models load with it
            self.chat.reconfigure(config)
        else:
            self.apply_config(config, "This chat's settings are in force again.")

    def action_export(self) -> None:
        chat_id = self.chat.chat_id
        if not self.chat.chats.available or chat_id is None:
            self.notify("Nothing to export yet: send a message first.", severity="warning")
        else:
            export_markdown(self, self.chat.chats, chat_id, self.export_dir)

    # -- the ways out ---------------------------------------------------------------------------

    def exit(self, result: int | None = None, return_code: int = 0,
             message: Any = None) -> None:
        """Stop a streaming reply and save it as it stands (stopped), then exit."""
        self.chat.stop_and_save()
        super().exit(result, return_code, message)

    async def action_quit(self) -> None:
        """Quit. A model load cannot be interrupted: the app says so and quits when it ends
        (a second ctrl+q leaves at once, and the process exits when the load is over)."""
        if self.is_loading and not self._quit_when_loaded:
            self._quit_when_loaded = True
            self.loader.say_quitting()
            return
        self.exit()

    def on_unmount(self) -> None:
        self._signals.remove()
        self.chat.close()  # an exit that did not pass through ``exit`` (a crash) saves too
        self.chat.chats.close()


def run_app(config: Config, config_path: Path | None = None,
            given: dict[str, Any] | None = None) -> int:
    """Run the chat app on ``config``'s pair until the user quits; returns the exit status.
    ``config_path`` is the config file the settings screen saves to (None: the default one),
    ``given`` the settings the command line gave (they win over the reopened chat's)."""
    app = SpecChatApp(config, config_path=config_path, given=given)
    app.run()
    for note in app.told_notes:  # the terminal's own screen keeps them after the app is gone
        print(f"specchat: {note}", file=sys.stderr)
    return app.return_code or 0
