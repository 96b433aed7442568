"""The chat app: loads the pair in a worker, streams replies token by token, keeps a history.

The app consumes the engine's event stream only. The model session comes from
``session_factory(config, progress)`` (``chatapp.loader.build_session`` by default), run in a
worker thread; tests pass a factory that builds a session on fake backends. Replies stream in a
worker thread too, which posts one message per speculation step (never per character).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import select
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar
from textual.worker import get_current_worker

from chatapp.backends.base import ChatMessage
from chatapp.config import Config
from chatapp.auto_policy import AutoDraftLength
from chatapp.draft_policy import (MAX_DRAFT_LENGTH, DraftPolicy, FixedDraftLength,
                                  SwitchablePolicy)
from chatapp.engine import ContextOverflowError
from chatapp.events import DoneEvent, StepEvent, TokenEvent, TokenSource
from chatapp.history import HistoryError, HistoryStore, StoredMessage
from chatapp.loader import LoadProgress as ProgressCallback
from chatapp.loader import build_session, generation_settings, make_policy
from chatapp.policy_memory import memory_path, recall, remember
from chatapp.session import ChatSession, fallback_template_note
from chatapp.tui.errors import describe_error
from chatapp.tui.messages import (LoadFailed, LoadProgress, ReplyDone, ReplyFailed, ReplyPlanned,
                                  ReplyStep, SessionLoaded)
from chatapp.tui.screens import ChatListScreen, HelpScreen, HelpSection, SettingsScreen, key_label
from chatapp.backends.rpc import rpc_label
from chatapp.tui.stats_view import TurnInfo, decode_tokens_per_s, is_target_only
from chatapp.tui.turn import Turn
from chatapp.tui.widgets import (ChatInput, Conversation, Legend, MessageView, Note, StatsPanel,
                                 StatusBar, printable_line)

SessionFactory = Callable[[Config, ProgressCallback], ChatSession]

# Fields whose change needs the models loaded again.
RELOAD_FIELDS = ("target", "draft", "backend", "draft_backend", "drafter", "n_ctx", "threads",
                 "gpu_layers", "device", "dtype", "rpc", "tensor_split")
# Longer descriptions for the help screen than the footer has room for.
HELP_TEXT = {
    "help": "Help: this list of keys",
    "stop": "Stop the reply (it is kept, marked stopped, and saved)",
    "draft_length(1)": "Draft length K + 1 (works mid-reply, from the next step)",
    "draft_length(-1)": "Draft length K - 1 (K 0: the target alone, the speedup baseline)",
    "toggle_stats": "Stats panel: the live, selected or latest turn",
    "toggle_highlight": "Token colours on / off (off: the reply as Markdown)",
    "settings": "Settings: sampling, K, seed, system prompt, models",
    "new_chat": "New chat",
    "chats": "Saved chats: open, delete, export",
    "export": "Export this chat to Markdown",
    "reload": "Reload the models",
    "quit": "Quit",
}

# A target-only turn shorter than this is too noisy to be the speedup baseline.
MIN_BASELINE_TOKENS = 8

# Signals that end the app like ctrl+q (the reply stopped and saved, the history closed): the
# terminal was closed (SIGHUP), the system or a process manager asks it to end (SIGTERM).
QUIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM")
                     if hasattr(signal, name))


def _drafter_label(config: Config) -> str:
    """Who drafts, for the header: the draft model, prompt lookup, or lookup then the model."""
    model = _short_model_name(config.draft)
    return {"ngram": "prompt lookup", "ngram+model": f"prompt lookup + {model}"}.get(
        config.drafter, model)


def _short_model_name(name: str) -> str:
    return Path(name).name if "/" in name or "\\" in name else name


class SpecChatApp(App[int]):
    """specchat's chat app. ``config_path`` is the file the settings screen saves to (None: the
    default place). ``session_factory``, ``history_path``, ``export_dir`` and ``clock`` are there
    for tests (fake backends, a temporary database, a fake clock)."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("escape", "stop", "Stop reply"),
        Binding("ctrl+up,alt+up", "draft_length(1)", "K+1", key_display="^↑"),
        Binding("ctrl+down,alt+down", "draft_length(-1)", "K-1", key_display="^↓"),
        Binding("f2,ctrl+g", "toggle_stats", "Stats"),
        Binding("f3,ctrl+t", "toggle_highlight", "Colours"),
        Binding("f4,ctrl+s", "settings", "Settings"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+o,f5", "chats", "Chats"),
        Binding("f9", "export", "Export", show=False),
        Binding("ctrl+r", "reload", "Reload models", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, config: Config, *, config_path: Path | None = None,
                 session_factory: SessionFactory | None = None,
                 history_path: Path | None = None, export_dir: Path | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.config = config
        self.config_path = config_path
        self.session_factory: SessionFactory = session_factory or build_session
        self.history_path = history_path
        self.export_dir = export_dir
        self.clock = clock
        self.history: HistoryStore | None = None
        self.session: ChatSession | None = None
        self.policy = SwitchablePolicy(make_policy(config))
        self._policy_from_config = True  # replaced by one that knows the drafter once loaded
        self.chat_id: int | None = None
        self.transcript: list[ChatMessage] = []  # the open chat, as sent to the model
        self.turn: Turn | None = None  # the reply streaming now
        self.pending: str | None = None  # a message sent before the models were ready
        self.highlight = True
        self.baseline_tps: float | None = None  # decode tok/s of a target-only turn, this session
        self._told_fallback_template = False  # the no-chat-template note shows once per model
        self.told_notes: list[str] = []  # the sessions' runtime notes shown so far, in order
        self.load_error: str | None = None
        self._load_generation = 0
        self._load_state = ("Starting", None)
        self._epoch = 0  # bumped when another chat is shown
        self._quit_when_loaded = False
        self._signal_handlers: dict[int, Any] = {}  # signal -> the handler before ours

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield Conversation(id="conversation")
                with Horizontal(id="loading"):
                    yield Label("", id="loading-text")
                    yield ProgressBar(id="loading-bar", show_eta=False, show_percentage=False)
                yield Legend(id="legend")
                yield ChatInput(id="input")
            yield StatsPanel(id="stats")
        yield Footer()

    @property
    def conversation(self) -> Conversation:
        return self.query_one("#conversation", Conversation)

    @property
    def chat_input(self) -> ChatInput:
        return self.query_one("#input", ChatInput)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one("#stats", StatsPanel)

    async def on_mount(self) -> None:
        self._install_signal_handlers()
        try:
            self.history = HistoryStore(self.history_path)
        except HistoryError as error:
            self.history = None
            self.notify(f"{error} Chats of this session will not be saved.",
                        title="No history", severity="error", timeout=15)
        self.conversation.anchor()
        self.stats_panel.show_nothing()
        await self._reopen_latest_chat()
        self.chat_input.focus()
        self.start_loading()

    async def _reopen_latest_chat(self) -> None:
        """Start where the user left off: the most recently used chat, or a new one."""
        chats = self.history.list_chats() if self.history is not None else []
        if chats:
            await self.open_chat(chats[0].id)
        else:
            self._show_welcome()

    def _show_welcome(self) -> None:
        self.conversation.mount(Note(
            "Ask anything. The small draft model proposes tokens, the target verifies them: "
            "each token is coloured by where it came from (legend below). ctrl+↑/ctrl+↓ change "
            "the draft length K while a reply streams, F2 shows the statistics, F1 all keys.",
            "welcome", id="welcome"))

    # -- status line ----------------------------------------------------------------------------

    def update_status(self) -> None:
        config = self.config
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" specchat ", style="bold reverse")
        where = f" {rpc_label(config.rpc, short=True)}" if config.rpc else ""
        text.append(f" {config.backend} │ draft {_drafter_label(config)} → target "
                    f"{_short_model_name(config.target)}{where} │ ")
        text.append(f"K {self.policy.label}", style="bold")
        if self.session is not None and self.session.engine.drafter is None:
            text.append(" (no draft loaded)")
        sampling = self.session.settings.sampling if self.session else None
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
        if self.load_error is not None:
            return "load failed (ctrl+r retry)", "bold red"
        if self.session is None:
            message, fraction = self._load_state
            percent = f" {fraction:.0%}" if fraction is not None else ""
            return f"loading…{percent}", "yellow"
        if self.turn is not None:
            if self.turn.cancel.is_set():
                return "stopping…", "yellow"
            stats = self.turn.stats(self.clock())
            return f"streaming {stats.tokens_per_s:.1f} tok/s (Esc stops)", "green"
        return "ready", "green"

    # -- loading --------------------------------------------------------------------------------

    def start_loading(self) -> None:
        self._load_generation += 1
        self.load_error = None
        self._load_state = ("Starting", None)
        for note in self.query("#load-error"):
            note.remove()
        self.query_one("#loading").display = True
        self.query_one("#loading-text", Label).update("Loading the models…")
        self.query_one("#loading-bar", ProgressBar).update(total=None, progress=0)
        self.update_status()
        self._load_session(self.config, self._load_generation)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_session(self, config: Config, generation: int) -> None:
        def progress(message: str, fraction: float | None) -> None:
            self.post_message(LoadProgress(message, fraction))

        try:
            session = self.session_factory(config, progress)
        except Exception as error:  # every failure becomes a readable message, never a traceback
            self.post_message(LoadFailed(describe_error(error), generation))
        else:
            self.post_message(SessionLoaded(session, generation))

    def on_load_progress(self, message: LoadProgress) -> None:
        if self.session is not None or not self.is_running:
            return
        self._load_state = (message.text, message.fraction)
        percent = f"  {message.fraction:.0%}" if message.fraction is not None else "…"
        self.query_one("#loading-text", Label).update(Text(message.text + percent))
        bar = self.query_one("#loading-bar", ProgressBar)
        if message.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=message.fraction)
        self.update_status()

    def on_session_loaded(self, message: SessionLoaded) -> None:
        if message.generation != self._load_generation or not self.is_running:
            _close_session(message.session)
            return
        self.session = message.session
        if self._quit_when_loaded:
            self.exit()
            return
        if self._policy_from_config:
            self.policy.replace(self._configured_policy(self.config))
        self.baseline_tps = None  # a new pair: measure the target alone again
        self._told_fallback_template = False
        self.query_one("#loading").display = False
        self._tell_runtime_notes(message.session.notes)
        self.update_status()
        if self.pending is not None:
            text, self.pending = self.pending, None
            self._start_turn(text, queued=True)

    def _tell_runtime_notes(self, notes: tuple[str, ...]) -> None:
        """Each note once per app run: in the conversation, and on stderr when the app exits."""
        for note in notes:
            if note not in self.told_notes:
                self.told_notes.append(note)
                self.conversation.mount(Note(note, "warning"))

    def on_load_failed(self, message: LoadFailed) -> None:
        if message.generation != self._load_generation or not self.is_running:
            return
        self.load_error = message.error
        if self._quit_when_loaded:
            self.exit()
            return
        self.query_one("#loading").display = False
        self.conversation.mount(Note(
            f"The models could not be loaded.\n{message.error}\nPress ctrl+r to try again, or "
            "F4 to change the models.", "error", id="load-error"), before=0)
        if self.pending is not None:
            self._unqueue_pending()
        self.update_status()

    def _unqueue_pending(self) -> None:
        text, self.pending = self.pending or "", None
        for view in self.query(".-queued"):
            view.remove()
        self.chat_input.restore(text)

    # -- sending --------------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    def send(self, message: ChatInput.Submitted) -> None:
        text = message.text
        if not text.strip():
            return
        if self.turn is not None:
            if self.turn.cancel.is_set():
                self.notify("The last reply is stopping; send again in a moment.")
            else:
                self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return
        if self.pending is not None:
            self.notify("Your last message is waiting for the models.", severity="warning")
            return
        if self.session is None and self.load_error is not None:
            self.notify("The models are not loaded: ctrl+r tries again, F4 changes them.",
                        severity="error")
            return
        self.chat_input.clear()
        if self.session is None:
            self.pending = text
            view = MessageView("user", text)
            view.add_class("-queued")
            self._mount_message(view)
            self.notify("Sending as soon as the models are loaded.", timeout=4)
            return
        self._start_turn(text)

    def _mount_message(self, *widgets: Any) -> None:
        for welcome in self.query("#welcome"):
            welcome.remove()
        self.conversation.mount(*widgets)
        self.conversation.scroll_end(animate=False)  # the user acted: follow the reply again

    def _start_turn(self, text: str, queued: bool = False) -> None:
        assert self.session is not None
        chat_id, user_message_id = self._save_user_message(text)
        turn = Turn(messages=[*self.transcript, ChatMessage("user", text)], user_text=text,
                    started_at=self.clock(), chat_id=chat_id, user_message_id=user_message_id,
                    meta=self._turn_meta(), epoch=self._epoch, k_start=self.policy.label)
        self.transcript = list(turn.messages)
        self.turn = turn
        view = MessageView("assistant", k_label=self.policy.label, highlight=self.highlight,
                           turn=turn, target_rpc=self.config.rpc)
        turn.view = view
        queued_views = list(self.query(".-queued"))
        if queued and queued_views:
            for queued_view in queued_views:
                queued_view.remove_class("-queued")
                queued_view.message_id = user_message_id
            self._mount_message(view)
        else:
            self._mount_message(MessageView("user", text, message_id=user_message_id), view)
        self.conversation.selected = None
        self._refresh_stats()
        self.update_status()
        self.refresh_bindings()
        self._stream_reply(self.session, turn)

    def _turn_meta(self) -> dict[str, Any]:
        settings = self.session.settings if self.session else generation_settings(self.config)
        return {"k": self.policy.label, "temperature": settings.sampling.temperature,
                "top_p": settings.sampling.top_p, "top_k": settings.sampling.top_k,
                "max_tokens": settings.max_tokens, "draft": self.config.draft,
                "target": self.config.target} | (
                    {"target_rpc": list(self.config.rpc)} if self.config.rpc else {})

    def _save_user_message(self, text: str) -> tuple[int | None, int | None]:
        if self.history is None:
            return self.chat_id, None
        if self.chat_id is None:
            title = printable_line(text)[:60]
            self.chat_id = self._write(self.history.create_chat, title, self.config.draft,
                                       self.config.target)
            if self.chat_id is None:
                return None, None
        return self.chat_id, self._write(self.history.add_message, self.chat_id, "user", text)

    def _write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A history write; a failure (disk full, file gone) is reported, never fatal."""
        try:
            return write(*args, **kwargs)
        except (sqlite3.Error, OSError) as error:
            where = self.history.path if self.history is not None else self.history_path
            if self.is_running:
                self.notify(f"Could not save to the history at {where}: {error}. The chat goes "
                            "on unsaved.", severity="error", timeout=10)
            return None

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _stream_reply(self, session: ChatSession, turn: Turn) -> None:
        worker = get_current_worker()
        try:
            plan, events = session.stream(turn.messages, self.policy, turn.cancel)
            self.post_message(ReplyPlanned(turn, len(plan.tokens), plan.dropped_messages,
                                           plan.fallback_template))
            pieces: list[tuple[str, TokenSource]] = []
            for event in events:
                if worker.is_cancelled:
                    turn.cancel.set()
                if isinstance(event, TokenEvent):
                    pieces.append((event.text, event.source))
                elif isinstance(event, StepEvent):
                    self.post_message(ReplyStep(turn, pieces, event))
                    pieces = []
                elif isinstance(event, DoneEvent):
                    if pieces:
                        self.post_message(ReplyStep(turn, pieces, None))
                    self.post_message(ReplyDone(turn, event.finish_reason.value, event.stats))
                    return
        except ContextOverflowError as error:  # nothing was generated: the message goes back
            turn.not_sent = True
            self.post_message(ReplyFailed(turn, (
                f"Your message was not sent. {error} (In the app: Settings, F4, Context.) "
                "Your message is back in the message box.")))
        except Exception as error:  # shown in the app; the typed text goes back to the input
            self.post_message(ReplyFailed(turn, describe_error(error)))

    def on_reply_planned(self, message: ReplyPlanned) -> None:
        if not self.is_running:
            return
        turn = message.turn
        turn.dropped_messages = message.dropped_messages
        turn.recorder.prompt_tokens = message.prompt_tokens
        if not self._turn_is_shown(turn):
            return
        if message.dropped_messages:
            n = message.dropped_messages
            words = "message was" if n == 1 else f"{n} messages were"
            note = Note(f"The oldest {words} left out of the context so that the conversation "
                        f"fits the model's window ({self.config.n_ctx} tokens).", "warning")
            self.conversation.mount(note, before=turn.view)
        if message.fallback_template and not self._told_fallback_template and self.session:
            self._told_fallback_template = True  # once per loaded model
            self.conversation.mount(
                Note(fallback_template_note(self.session.engine.target.name), "warning"),
                before=turn.view)

    def on_reply_step(self, message: ReplyStep) -> None:
        turn = message.turn
        turn.add_step(message.pieces, message.step, self.clock())
        if not self.is_running:
            return
        if len(turn.steps) == 1 and message.step is not None:
            # Live estimate of the prompt's time (the engine's own figure comes with the end).
            first_step_s = message.step.draft_s + message.step.verify_s
            turn.recorder.prompt_s = max(0.0, self.clock() - turn.started_at - first_step_s)
        view: MessageView = turn.view
        view.k_label = turn.k_label()
        if view.is_attached:
            view.append(message.pieces)
            view.update_header(turn.stats(self.clock()))
        if message.step is not None:
            self._refresh_stats()
            self.update_status()

    def on_reply_done(self, message: ReplyDone) -> None:
        turn = message.turn
        turn.final_stats = message.stats
        turn.finish_reason = message.finish_reason
        if not self.is_running:  # quitting: save what there is, leave the widgets alone
            self._save_turn(turn, message.finish_reason, message.stats)
            return
        self._finish_turn(turn, message.finish_reason, message.stats)
        if isinstance(self.policy.inner, AutoDraftLength):
            remember(self.policy.inner, memory_path(self.config))
        if is_target_only(message.stats) and message.stats.tokens >= MIN_BASELINE_TOKENS:
            self.baseline_tps = decode_tokens_per_s(message.stats)

    def on_reply_failed(self, message: ReplyFailed) -> None:
        turn = message.turn
        turn.finish_reason = "error"
        if not self.is_running:
            if turn.text:
                self._save_turn(turn, "error", turn.stats(self.clock()))
            return
        view: MessageView = turn.view
        shown = self._turn_is_shown(turn)
        if turn.text:
            self._finish_turn(turn, "error", turn.stats(self.clock()))
        else:
            self.turn = None
            if self.history is not None and turn.user_message_id is not None:
                self._write(self.history.delete_message, turn.user_message_id)
                chat = self.history.get_chat(turn.chat_id) if turn.chat_id else None
                if chat is not None and chat.message_count == 0:
                    self._write(self.history.delete_chat, chat.id)
                    if self.chat_id == chat.id:
                        self.chat_id = None
            if shown:
                self.transcript = self.transcript[:-1]
                views = self.conversation.views
                if view in views:
                    index = views.index(view)
                    if index > 0 and views[index - 1].role == "user":
                        views[index - 1].remove()
                    view.remove()
            self.chat_input.restore(turn.user_text)
            self.update_status()
            self.refresh_bindings()
            self._refresh_stats()
        if turn.not_sent and not turn.text:
            if shown:
                self.conversation.mount(Note(message.error, "error"))
            self.notify(message.error, title="Message too long", severity="error", timeout=10,
                        markup=False)
            return
        if shown:
            self.conversation.mount(Note(f"The reply failed. {message.error}", "error"))
        self.notify(message.error, title="The reply failed", severity="error", timeout=10,
                    markup=False)

    def _save_turn(self, turn: Turn, finish_reason: str, stats: Any) -> None:
        """Save the reply to its chat, once (a reply stopped by quitting is saved at exit)."""
        turn.meta["k"] = turn.k_label()
        if turn.saved or self.history is None or turn.chat_id is None:
            return
        turn.saved = True
        turn.view.message_id = self._write(
            self.history.add_message, turn.chat_id, "assistant", turn.text, runs=turn.pieces,
            finish_reason=finish_reason, stats=stats, meta=turn.meta)

    def _turn_is_shown(self, turn: Turn) -> bool:
        return turn.epoch == self._epoch

    def _finish_turn(self, turn: Turn, finish_reason: str, stats: Any) -> None:
        """Mark the reply done (or stopped), save it, and let the user send again."""
        view: MessageView = turn.view
        view.k_label = turn.k_label()
        view.finish(finish_reason, stats)
        self._save_turn(turn, finish_reason, stats)
        if self._turn_is_shown(turn):
            self.transcript.append(ChatMessage("assistant", turn.text))
        self.turn = None
        self.update_status()
        self.refresh_bindings()
        self._refresh_stats()

    # -- stats panel ----------------------------------------------------------------------------

    @on(Conversation.SelectionChanged)
    def _selection_changed(self) -> None:
        self._refresh_stats()

    def _stats_view(self) -> MessageView | None:
        """The selected reply (a selected user message means the reply to it), else the live
        one, else the latest."""
        views = self.conversation.views
        replies = [v for v in views if v.role == "assistant"]
        selected = self.conversation.selected
        if selected in views:
            index = views.index(selected)
            following = [v for v in views[index:] if v.role == "assistant"]
            if following:
                return following[0]
        if self.turn is not None and self._turn_is_shown(self.turn):
            return self.turn.view
        return replies[-1] if replies else None

    def _refresh_stats(self) -> None:
        panel = self.stats_panel
        if not panel.display:
            return
        view = self._stats_view()
        if view is None:
            panel.show_nothing()
            return
        replies = [v for v in self.conversation.views if v.role == "assistant"]
        number = replies.index(view) + 1 if view in replies else len(replies)
        live = view.live
        stats = view.turn.stats(self.clock()) if live and view.turn else view.stats
        info = TurnInfo(f"Turn {number}", view.k_label, view.finish_reason, live,
                        view.target_rpc)
        panel.show(stats, info, self.baseline_tps)

    # -- actions --------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.turn is not None or self.pending is not None else None
        return True

    def action_stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel.set()
            self.update_status()
        elif self.pending is not None:
            self._unqueue_pending()
            self.refresh_bindings()

    def action_draft_length(self, delta: int) -> None:
        current = self.turn.last_k if self.turn is not None else None
        before = self.policy.inner
        k = self.policy.adjust(delta, current)
        if self.policy.inner is not before:
            self._policy_changed()
        if self.session is not None and self.session.engine.drafter is None and k > 0:
            self.notify("No draft model is loaded, so the target decodes alone. Reload with a "
                        "draft model (F4) to speculate.", severity="warning")
        self.update_status()
        self._refresh_stats()

    def set_draft_length(self, k: int) -> None:
        inner = self.policy.inner
        if isinstance(inner, FixedDraftLength):
            inner.set(k)
        else:
            self.policy.replace(FixedDraftLength(min(max(k, 0), MAX_DRAFT_LENGTH)))
            self._policy_changed()
        self.update_status()

    def _install_policy(self, config: Config) -> None:
        """The policy ``config`` asks for, told about the loaded drafter (if any)."""
        self._policy_changed()
        self.policy.replace(self._configured_policy(config))
        self._policy_from_config = self.session is None

    def _configured_policy(self, config: Config) -> DraftPolicy:
        """``make_policy``; an auto policy starts from what the last run on this machine and pair
        measured (``chatapp.policy_memory``)."""
        policy = make_policy(config)
        if isinstance(policy, AutoDraftLength) and self.session is not None:
            recall(policy, memory_path(config))
        return policy

    def _policy_changed(self) -> None:
        """The policy in force no longer follows the configuration."""
        self._policy_from_config = False

    def set_auto_draft_length(self) -> None:
        self._install_policy(dataclasses.replace(self.config, draft_length="auto"))
        self.update_status()

    def action_toggle_stats(self) -> None:
        panel = self.stats_panel
        panel.display = not panel.display
        self._refresh_stats()

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for view in self.conversation.views:
            view.set_highlighting(self.highlight)
        self.query_one(Legend).show_colours(self.highlight)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_sections()))

    def help_sections(self) -> list[HelpSection]:
        app_keys = [(key_label(b.key), HELP_TEXT.get(b.action, b.description))
                    for b in self.BINDINGS if isinstance(b, Binding)]
        app_keys.append(("ctrl+p", "Command palette (settings, K, chats, export…)"))
        return [
            ("Anywhere in the chat", app_keys),
            ("Message box", [
                ("Enter", "Send (waits for the models while they load)"),
                ("ctrl+j / shift+enter", "New line"),
                ("ctrl+z / ctrl+y", "Undo / redo"),
                ("ctrl+a / ctrl+e", "Start / end of line"),
                ("ctrl+x / ctrl+c / ctrl+v", "Cut / copy / paste"),
                ("Tab", "Go to the messages"),
            ]),
            ("Messages (after Tab, or click one)", [
                ("↑ / ↓ (k / j)", "Select a message: the stats panel shows its turn"),
                ("Home / End", "First / last message"),
                ("Enter / Esc", "Back to the message box"),
                ("?", "This help"),
            ]),
            ("Chat list (ctrl+o)", [
                ("Enter", "Open the chat"),
                ("n", "New chat"),
                ("d, d", "Delete the chat"),
                ("e", "Export it to Markdown"),
                ("Esc", "Close"),
            ]),
        ]

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.config, self.config_path), self.apply_config)

    def apply_config(self, config: Config | None) -> None:
        if config is None or config == self.config:
            return
        old, self.config = self.config, config
        if config.draft_length != old.draft_length:
            self._install_policy(config)
        if self.session is not None:
            self.session.settings = generation_settings(config)
            self.session.system_prompt = config.system_prompt
            if config.seed is not None and config.seed != old.seed:
                self.session.seed = config.seed
                self.session.rng = np.random.default_rng(config.seed)
        reload = any(getattr(old, name) != getattr(config, name) for name in RELOAD_FIELDS)
        if reload:
            if self.turn is not None:
                self.notify("The new models load after this reply: press ctrl+r then.",
                            severity="warning")
            else:
                self.action_reload()
        else:
            self.notify("Settings applied from the next reply.", timeout=3)
        self.update_status()

    def action_reload(self) -> None:
        if self.turn is not None:
            self.notify("Stop the reply first (Esc), then reload.", severity="warning")
            return
        if self.session is not None:
            _close_session(self.session)
            self.session = None
        self.start_loading()

    async def action_new_chat(self) -> None:
        await self._show_chat(None, [])

    def action_chats(self) -> None:
        if self.history is None:
            self.notify("The history is not available in this session.", severity="error")
            return
        self.push_screen(ChatListScreen(self.history, self.chat_id, self.export_dir),
                         self._chat_chosen)

    async def _chat_chosen(self, result: tuple[str, int] | None) -> None:
        if self.history is None:
            return
        deleted = self.chat_id is not None and self.history.get_chat(self.chat_id) is None
        if result is not None and result[0] == "open":
            await self.open_chat(result[1])
        elif deleted or result is not None:  # a new chat, or the open one was deleted
            await self._show_chat(None, [])

    async def open_chat(self, chat_id: int) -> None:
        assert self.history is not None
        await self._show_chat(chat_id, self.history.messages(chat_id))

    async def _show_chat(self, chat_id: int | None, messages: list[StoredMessage]) -> None:
        if self.turn is not None:
            self.turn.cancel.set()  # it finishes in the background and is saved to its chat
        self._epoch += 1
        self.chat_id = chat_id
        self.transcript = [ChatMessage(m.role, m.content) for m in messages]
        conversation = self.conversation
        conversation.selected = None
        await conversation.remove_children()
        views = [self._stored_view(m) for m in messages]
        if views:
            await conversation.mount_all(views)
            conversation.scroll_end(animate=False)
        else:
            self._show_welcome()
        self.call_after_refresh(self._refresh_stats)
        self.update_status()
        self.chat_input.focus()

    def _stored_view(self, message: StoredMessage) -> MessageView:
        return MessageView(message.role, message.content, pieces=message.runs,
                           stats=message.stats, k_label=str(message.meta.get("k", "")),
                           finish_reason=message.finish_reason, message_id=message.id,
                           highlight=self.highlight,
                           target_rpc=message.meta.get("target_rpc", ()))

    def action_export(self) -> None:
        if self.history is None or self.chat_id is None:
            self.notify("Nothing to export yet: send a message first.", severity="warning")
            return
        try:
            path = self.history.export_markdown(self.chat_id, self.export_dir)
        except (OSError, HistoryError) as error:
            self.notify(f"Could not export the chat: {error}", severity="error")
            return
        self.notify(f"Exported to {path}", title="Chat exported", timeout=10)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New chat", "Start an empty chat (ctrl+n)", self.action_new_chat)
        yield SystemCommand("Chats", "Open, delete or export saved chats (ctrl+o)",
                            self.action_chats)
        yield SystemCommand("Settings", "Sampling, draft length, system prompt, models (F4)",
                            self.action_settings)
        yield SystemCommand("Export chat", "Write this chat as Markdown (F9)", self.action_export)
        yield SystemCommand("Toggle stats panel", "Speculation statistics (F2)",
                            self.action_toggle_stats)
        yield SystemCommand("Toggle token colours", "Colours or Markdown (F3)",
                            self.action_toggle_highlight)
        yield SystemCommand("Reload models", "Load the pair again (ctrl+r)", self.action_reload)
        yield SystemCommand("Keys", "Show every key (F1)", self.action_help)
        yield SystemCommand("Draft length auto", "Let the adaptive policy choose K per step",
                            self.set_auto_draft_length)
        for k in (0, 1, 2, 3, 4, 5, 6, 8):
            note = " (target alone: measures the speedup baseline)" if k == 0 else ""
            yield SystemCommand(f"Draft length K = {k}", f"Draft {k} tokens per step{note}",
                                lambda k=k: self.set_draft_length(k))

    # -- shutdown -------------------------------------------------------------------------------

    def exit(self, result: int | None = None, return_code: int = 0,
             message: Any = None) -> None:
        """Stop a streaming reply and save it as it stands (stopped), then exit."""
        self._stop_and_save_reply()
        super().exit(result, return_code, message)

    def _stop_and_save_reply(self) -> None:
        turn = self.turn
        if turn is not None and not turn.done:
            turn.cancel.set()
            self._save_turn(turn, "cancelled", turn.stats(self.clock()))

    def _install_signal_handlers(self) -> None:
        """Quit like ctrl+q on SIGHUP and SIGTERM: by default they end the process at once, and
        the reply streaming then is lost. Needs the app's loop in the main thread (as ``run``
        has it); elsewhere the signals keep their handlers."""
        loop = asyncio.get_running_loop()
        for signum in QUIT_SIGNALS:
            previous = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, self._quit_on_signal, signum)
            except (ValueError, RuntimeError, NotImplementedError):
                continue
            self._signal_handlers[signum] = previous

    def _remove_signal_handlers(self) -> None:
        if not self._signal_handlers:
            return
        loop = asyncio.get_running_loop()
        for signum, previous in self._signal_handlers.items():
            try:
                loop.remove_signal_handler(signum)
                if previous is not None:
                    signal.signal(signum, previous)
            except (ValueError, RuntimeError):
                pass
        self._signal_handlers.clear()

    def _quit_on_signal(self, signum: int) -> None:
        """The terminal was closed, or the system asks the app to end: stop the reply, save it
        as it stands, close the history and exit (status 128 + the signal, as a shell reports a
        process ended by a signal)."""
        if signum == getattr(signal, "SIGHUP", None) and _terminal_hung_up():
            # Nothing can be shown or restored any more, and Textual's shutdown would write to
            # the dead terminal: its output thread ends at the first failed write, and the app
            # then waits for it forever. Save, close the history and leave at once.
            self._stop_and_save_reply()
            if self.history is not None:
                self.history.close()
            os._exit(128 + signum)
        self.exit(return_code=128 + signum)

    async def action_quit(self) -> None:
        """Quit. A model load cannot be interrupted: the app says so and quits when it ends
        (a second ctrl+q leaves at once, and the process exits when the load is over)."""
        loading = self.session is None and self.load_error is None
        if loading and not self._quit_when_loaded:
            self._quit_when_loaded = True
            self.query_one("#loading-text", Label).update(
                "Quitting when the models have loaded (a load cannot be interrupted)…")
            return
        self.exit()

    def on_unmount(self) -> None:
        self._remove_signal_handlers()
        if self.turn is not None:  # an exit that did not pass through ``exit`` (a crash)
            self._stop_and_save_reply()
        elif self.session is not None:
            _close_session(self.session)
        if self.history is not None:
            self.history.close()


def _terminal_hung_up() -> bool:
    """Whether the terminal the app draws on (stderr, as Textual has it) was closed: its
    descriptor then polls as hung up, or as an error for a pipe nobody reads."""
    stream = sys.__stderr__
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):
        return False
    if fd < 0:
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poll.poll(0))


def _close_session(session: ChatSession) -> None:
    """Release both models; best effort (the process may be exiting)."""
    try:
        session.engine.close()
    except Exception:
        pass


def run_app(config: Config, config_path: Path | None = None) -> int:
    """Run the chat app on ``config``'s pair until the user quits; returns the exit status.
    ``config_path`` is the config file the settings screen saves to (None: the default one)."""
    app = SpecChatApp(config, config_path=config_path)
    app.run()
    for note in app.told_notes:  # the terminal's own screen keeps them after the app is gone
        print(f"specchat: {note}", file=sys.stderr)
    return app.return_code or 0
