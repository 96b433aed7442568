"""The chat app: the screen, its status line and stats panel, and the keys that act on them.

The app renders what its conversation (``chatapp.chat.conversation.Conversation``, ``self.chat``) holds and
yields, and forwards the user's keys to it; it never calls a model, a drafter or the history
itself. The parts of the app live in their own modules: loading the models (``loading``),
sending and streaming (``replies``), the message actions (``chat_actions``), the keys
(``keys``) and the ways out (``shutdown``). The model session comes from
``session_factory(config, progress)`` (``chatapp.chat.loader.build_session`` over the history by default), run in a
worker thread; tests pass a factory that builds a session on fake backends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar

from chatapp.chat.conversation import Conversation
from chatapp.chat.history import HistoryError, HistoryStore
from chatapp.chat.loader import LoadProgress as ProgressCallback
from chatapp.chat.loader import build_session
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import ChatEntry
from chatapp.settings.config import Config, rpc_label
from chatapp.tui.chat_actions import ChatActionsMixin
from chatapp.tui.chat_input import ChatInput
from chatapp.tui.keys import BINDINGS, help_sections, system_commands
from chatapp.tui.loading import LoadingMixin
from chatapp.tui.replies import RepliesMixin
from chatapp.tui.screens import ChatListScreen, HelpScreen, SettingsScreen
from chatapp.tui.shutdown import ShutdownMixin
from chatapp.tui.stats_view import TurnInfo
from chatapp.tui.widgets import Legend, MessageList, MessageView, Note, StatsPanel, StatusBar

SessionFactory = Callable[[Config, ProgressCallback], ChatSession]


def _drafter_label(config: Config) -> str:
    """Who drafts, for the header: the draft model, prompt lookup, or lookup then the model."""
    model = _short_model_name(config.draft)
    return {"ngram": "prompt lookup", "ngram+model": f"prompt lookup + {model}"}.get(
        config.drafter, model)


def _short_model_name(name: str) -> str:
    return Path(name).name if "/" in name or "\\" in name else name


class SpecChatApp(ShutdownMixin, LoadingMixin, RepliesMixin, ChatActionsMixin, App[int]):
    """specchat's chat app. ``config_path`` is the file the settings screen saves to (None: the
    default place). ``session_factory``, ``history_path`` and ``export_dir`` are there for tests
    (fake backends, a temporary database)."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = BINDINGS

    def __init__(self, config: Config, *, config_path: Path | None = None,
                 session_factory: SessionFactory | None = None,
                 history_path: Path | None = None, export_dir: Path | None = None) -> None:
        super().__init__()
        self.config_path = config_path
        self.session_factory: SessionFactory = session_factory or self._build_session
        self.history_path = history_path
        self.export_dir = export_dir
        self.chat = Conversation(config, None, on_write_error=self._history_write_failed)
        self.pending: str | None = None  # a message sent before the models were ready
        self.editing: ChatEntry | None = None  # the user message Enter resends in its place
        self._text_before_edit = ""
        self.highlight = True
        self.told_notes: list[str] = []  # the sessions' runtime notes shown so far, in order
        self.load_error: str | None = None
        self._load_generation = 0
        self._load_state: tuple[str, float | None] = ("Starting", None)
        self._quit_when_loaded = False

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield MessageList(id="conversation")
                with Horizontal(id="loading"):
                    yield Label("", id="loading-text")
                    yield ProgressBar(id="loading-bar", show_eta=False, show_percentage=False)
                yield Legend(id="legend")
                yield ChatInput(id="input")
            yield StatsPanel(id="stats")
        yield Footer()

    @property
    def config(self) -> Config:
        return self.chat.config

    @property
    def message_list(self) -> MessageList:
        return self.query_one("#conversation", MessageList)

    @property
    def chat_input(self) -> ChatInput:
        return self.query_one("#input", ChatInput)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one("#stats", StatsPanel)

    def _build_session(self, config: Config, progress: ProgressCallback) -> ChatSession:
        """``build_session`` with the default drafter's index over the saved chats, read through
        a connection of this (loading) thread's own; without a readable history, without it."""
        try:
            store = HistoryStore(self.history_path)
        except HistoryError:
            return build_session(config, progress)
        try:
            return build_session(config, progress, history=store)
        finally:
            store.close()

    async def on_mount(self) -> None:
        self._install_signal_handlers()
        try:
            self.chat.history = HistoryStore(self.history_path)
        except HistoryError as error:
            self.notify(f"{error} Chats of this session will not be saved.",
                        title="No history", severity="error", timeout=15)
        self.message_list.anchor()
        self.stats_panel.show_nothing()
        chats = self.chat.history.list_chats() if self.chat.history is not None else []
        await self.open_chat(chats[0].id if chats else None)  # where the user left off
        self.start_loading()

    def _show_welcome(self) -> None:
        self.message_list.mount(Note(
            "Ask anything. The small draft model proposes tokens, the target verifies them: "
            "each token is coloured by where it came from (legend below). ctrl+↑/ctrl+↓ change "
            "the draft length K while a reply streams, F2 shows the statistics, F1 all keys.",
            "welcome", id="welcome"))

    def _history_write_failed(self, text: str) -> None:
        if self.is_running:
            self.notify(text, severity="error", timeout=10, markup=False)

    # -- status line ----------------------------------------------------------------------------

    def update_status(self) -> None:
        config, session = self.config, self.chat.session
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" specchat ", style="bold reverse")
        where = f" {rpc_label(config.rpc, short=True)}" if config.rpc else ""
        text.append(f" {config.backend} │ draft {_drafter_label(config)} → target "
                    f"{_short_model_name(config.target)}{where} │ ")
        text.append(f"K {self.chat.k_label}", style="bold")
        if session is not None and not self.chat.has_drafter:
            text.append(" (no draft loaded)")
        sampling = session.settings.sampling if session else None
        temperature = sampling.temperature if sampling else config.temperature
        text.append(f" │ T {temperature:g}")
        top_p = sampling.top_p if sampling else config.top_p
        top_k = sampling.top_k if sampling else config.top_k
        if top_p < 1:
            text.append(f" top-p {top_p:g}")
        if top_k:
            text.append(f" top-k {top_k}")
        text.append(" │ ")
        text.append(*self._state_text())
        self.query_one("#status", StatusBar).update(text)

    def _state_text(self) -> tuple[str, str]:
        chat = self.chat
        if self.load_error is not None:
            return "load failed (ctrl+r retry)", "bold red"
        if chat.session is None:
            message, fraction = self._load_state
            percent = f" {fraction:.0%}" if fraction is not None else ""
            return f"loading…{percent}", "yellow"
        if chat.turn is not None:
            if chat.turn.cancel.is_set():
                return "stopping…", "yellow"
            stats = chat.turn.stats()
            return f"streaming {stats.tokens_per_s:.1f} tok/s (Esc stops)", "green"
        if chat.replaying is not None:
            return "replaying at K 0… (Esc stops)", "yellow"
        if self.editing is not None:
            return "editing a message (Enter resends, Esc cancels)", "yellow"
        return "ready", "green"

    # -- stats panel ----------------------------------------------------------------------------

    def on_message_list_selection_changed(self) -> None:
        self._refresh_stats()

    def _stats_view(self) -> MessageView | None:
        """The selected reply (a selected user message means the reply to it), else the live
        one, else the latest."""
        views = self.message_list.views
        replies = [v for v in views if v.role == "assistant"]
        selected = self.message_list.selected
        if selected in views:
            following = [v for v in views[views.index(selected):] if v.role == "assistant"]
            if following:
                return following[0]
        live = next((v for v in replies if v.live), None)
        return live or (replies[-1] if replies else None)

    def _refresh_stats(self) -> None:
        panel = self.stats_panel
        if not panel.display:
            return
        view = self._stats_view()
        if view is None:
            panel.show_nothing()
            return
        replies = [v for v in self.message_list.views if v.role == "assistant"]
        number = replies.index(view) + 1 if view in replies else len(replies)
        stats = view.turn.stats() if view.live else view.stats
        info = TurnInfo(f"Turn {number}", view.k_label, view.finish_reason, view.live,
                        view.target_rpc, view.entry.replay if view.entry else None)
        panel.show(stats, info, self.chat.baseline_tps)

    # -- actions --------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            active = self.chat.busy or self.pending is not None or self.editing is not None
            return True if active else None
        return True

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
        self.highlight = not self.highlight
        for view in self.message_list.views:
            view.set_highlighting(self.highlight)
        self.query_one(Legend).show_colours(self.highlight)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_sections()))

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.config, self.config_path), self.apply_config)

    def apply_config(self, config: Config | None) -> None:
        if config is None or config == self.config:
            return
        if not self.chat.reconfigure(config):
            self.notify("Settings applied from the next reply.", timeout=3)
        elif self.chat.busy:
            self.notify("The new models load after this reply: press ctrl+r then.",
                        severity="warning")
        else:
            self.action_reload()
        self.update_status()

    async def action_new_chat(self) -> None:
        await self.open_chat(None)

    def action_chats(self) -> None:
        history = self.chat.history
        if history is None:
            self.notify("The history is not available in this session.", severity="error")
            return
        self.push_screen(ChatListScreen(history, self.chat.chat_id, self.export_dir,
                                        delete_chat=self.chat.delete_chat), self._chat_chosen)

    async def _chat_chosen(self, result: tuple[str, int] | None) -> None:
        history, chat_id = self.chat.history, self.chat.chat_id
        if history is None:
            return
        deleted = chat_id is not None and history.get_chat(chat_id) is None
        if result is not None and result[0] == "open":
            await self.open_chat(result[1])
        elif deleted or result is not None:  # a new chat, or the open one was deleted
            await self.open_chat(None)

    async def open_chat(self, chat_id: int | None) -> None:
        """Show saved chat ``chat_id`` (None: a new chat)."""
        entries = self.chat.open_chat(chat_id)
        self.editing = None
        message_list = self.message_list
        message_list.selected = None
        await message_list.remove_children()
        if entries:
            await message_list.mount_all([MessageView.of(e, self.highlight) for e in entries])
            message_list.scroll_end(animate=False)
        else:
            self._show_welcome()
        self.call_after_refresh(self._refresh_stats)
        self.update_status()
        self.chat_input.focus()

    def action_export(self) -> None:
        history, chat_id = self.chat.history, self.chat.chat_id
        if history is None or chat_id is None:
            self.notify("Nothing to export yet: send a message first.", severity="warning")
            return
        try:
            path = history.export_markdown(chat_id, self.export_dir)
        except (OSError, HistoryError) as error:
            self.notify(f"Could not export the chat: {error}", severity="error")
            return
        self.notify(f"Exported to {path}", title="Chat exported", timeout=10)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from system_commands(self)


def run_app(config: Config, config_path: Path | None = None) -> int:
    """Run the chat app on ``config``'s pair until the user quits; returns the exit status.
    ``config_path`` is the config file the settings screen saves to (None: the default one)."""
    app = SpecChatApp(config, config_path=config_path)
    app.run()
    for note in app.told_notes:  # the terminal's own screen keeps them after the app is gone
        print(f"specchat: {note}", file=sys.stderr)
    return app.return_code or 0
