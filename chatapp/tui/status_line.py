"""The status line at the top: the backend, who drafts for which target, the draft length K, the
sampling settings and what the app is doing (loading, streaming, replaying, editing, ready); at
its right the context meter: the tokens the next turn's prompt uses of the context window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import get_current_worker

from chatapp.chat.attachments import Attachment
from chatapp.chat.context import ContextUse
from chatapp.chat.conversation import Conversation
from chatapp.chat.mentions import mentioned_paths, mentions_to_count
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config, rpc_label
from chatapp.tui.loading import ModelLoader
from chatapp.tui.repaint import repaint


def drafter_label(config: Config) -> str:
    """Who drafts, for the status line: the draft model, prompt lookup, or lookup then the
    model."""
    model = short_model_name(config.draft)
    return {"ngram": "prompt lookup", "ngram+model": f"prompt lookup + {model}"}.get(
        config.drafter, model)


def short_model_name(name: str) -> str:
    """A model's file name without its folders; an alias as it is."""
    return Path(name).name if "/" in name or "\\" in name else name


class StatusBar(Static):
    """The top line: models, backend, draft length K, sampling, state. When the line is too
    long for the terminal, the models' names give way (an ellipsis), never where the target
    runs, K or the state."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._parts = (Text(), Text())  # what gives way, what stays

    def show(self, chat: Conversation, loader: ModelLoader, editing: bool) -> None:
        """Show ``chat``'s models and settings, and the state of ``chat``, ``loader`` and an
        edit in the message box (``editing``)."""
        config, session = chat.config, chat.session
        models = Text()
        models.append(" specchat ", style="bold reverse")
        where = f" {rpc_label(config.rpc, short=True)}" if config.rpc else ""
        models.append(f" {config.backend} │ draft {drafter_label(config)} → target "
                      f"{short_model_name(config.target)}")
        text = Text(f"{where} │ " + (f"{config.preset} │ " if config.preset else ""))
        text.append(f"K {chat.k_label}", style="bold")
        if session is not None and not chat.has_drafter:
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
        text.append(*state_text(chat, loader, editing))
        self._parts = (models, text)
        repaint(self)

    def render(self) -> Text:
        """The line at the widget's width, the models' names cut first."""
        models, rest = (part.copy() for part in self._parts)
        if self.size.width:
            models.truncate(max(0, self.size.width - rest.cell_len), overflow="ellipsis")
        line = models + rest
        line.no_wrap, line.overflow = True, "ellipsis"
        return line


def state_text(chat: Conversation, loader: ModelLoader, editing: bool) -> tuple[str, str]:
    """What the app is doing, and its style."""
    if loader.error is not None:
        return "load failed (ctrl+r retry)", "bold red"
    if chat.session is None:
        _message, fraction = loader.state
        percent = f" {fraction:.0%}" if fraction is not None else ""
        return f"loading…{percent}", "yellow"
    if chat.turn is not None:
        if chat.turn.cancel.is_set():
            return "stopping…", "yellow"
        stats = chat.turn.stats()
        return f"streaming {stats.tokens_per_s:.1f} tok/s (Esc stops)", "green"
    if chat.replaying is not None:
        return "replaying at K 0… (Esc stops)", "yellow"
    if editing:
        return "editing a message (Enter resends, Esc cancels)", "yellow"
    return "ready", "green"

METER_DELAY_S = 0.3  # the context meter counts the typed text once the typing pauses this long


class ContextMeter(Static):
    """The context meter: "ctx 1.2k/4k", the tokens the next turn's prompt uses of the context
    window (the chat and the text in the message box, its ``@path`` files read, as the
    ``overflow`` setting would send them), and how many of the chat's messages are out of the
    model's view. From 80% of the window on it has the class ``-warning``. The app tells it what
    to show (``show``)."""

    _timer: Timer | None = None

    def follow(self, chat: Conversation, text: str, folder: Path,
               then: Callable[[ContextUse], object] = lambda use: None) -> None:
        """Show the context ``chat``'s next turn uses with ``text`` in the message box, its
        ``@path`` files (relative to ``folder``) counted as they will be sent
        (``mentions_to_count``), then call ``then`` with it; not while a worker runs the models
        (their tokenizer): the turn's end counts again. The files are read in a thread of their
        own (a slow disk, a file that is no file, must not freeze the app); the counting, with
        the models' tokenizer, is done back on the app's thread."""
        if chat.busy:
            return
        if not mentioned_paths(text):
            self._count(chat, text, [], then)
            return

        def read() -> None:
            files = mentions_to_count(text, folder)[1]
            if not get_current_worker().is_cancelled:
                self.app.call_from_thread(self._count, chat, text, files, then)

        self.run_worker(read, thread=True, group="meter", exclusive=True)

    def _count(self, chat: Conversation, text: str, files: list[Attachment],
               then: Callable[[ContextUse], object]) -> None:
        if chat.busy or not self.is_attached:
            return
        try:
            use = chat.context_use(text, files)
        except UserFacingError:  # the models failed (a closed RPC target): the next turn says so
            use = None
        self.show(use)
        if use is not None:
            then(use)

    def later(self, box: Widget, count: Callable[[], object]) -> None:
        """Run ``count`` once the typing in ``box`` pauses ``METER_DELAY_S`` (a new call restarts
        the wait), unless ``box`` is gone by then (the app closing)."""
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(METER_DELAY_S, lambda: box.is_attached and count())

    def show(self, use: ContextUse | None) -> None:
        """Show ``use`` (None: the models are not loaded, nothing to count with)."""
        self.set_class(use is not None and use.warning, "-warning")
        if use is None:
            self.update("ctx –")
            self.tooltip = "The context used is counted once the models are loaded."
            return
        text = f"ctx {short_tokens(use.used)}/{short_tokens(use.n_ctx)}"
        self.update(f"{text}, {use.left_out} out of view" if use.left_out else text)
        self.tooltip = context_tooltip(use)


def short_tokens(count: int) -> str:
    """A token count in a few characters: 950, 1.2k, 4k (k = 1024 tokens)."""
    if count < 1024:
        return str(count)
    return f"{count / 1024:.1f}".removesuffix(".0") + "k"


def context_tooltip(use: ContextUse) -> str:
    """The meter's numbers in full."""
    text = (f"The next turn's prompt: {use.used:,} of the {use.n_ctx:,} tokens of the context "
            f"window ({use.used / use.n_ctx:.0%}); a prompt may have {use.room:,}, the rest is "
            "kept for the reply.")
    if use.over:
        text += f" {use.over:,} tokens over: the message would not be sent."
    if use.left_out:
        text += (f" The {use.left_out} oldest messages are out of the model's view "
                 "(overflow = drop-oldest).")
    return text
