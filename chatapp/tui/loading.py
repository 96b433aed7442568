"""Loading the models: the line above the message box that runs a load and shows its progress.

``ModelLoader.start(config)`` runs ``factory(config, progress)`` in a worker thread and shows the
progress it reports. Its messages bubble up to the app: ``LoadProgress`` (the status line follows),
then ``SessionLoaded`` (the app hands the session to its conversation) or ``LoadFailed`` (a readable
message, never a traceback). A load started again (ctrl+r) makes the earlier one stale: its
session is closed, never used, and its messages stop here. A load cannot be interrupted.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from chatapp.assembly.loader import LoadProgress as ProgressCallback
from chatapp.chat.session import ChatSession
from chatapp.settings.config import Config
from chatapp.tui.errors import describe_error
from chatapp.tui.messages import LoadFailed, LoadProgress, SessionLoaded

SessionFactory = Callable[[Config, ProgressCallback], ChatSession]


class ModelLoader(Horizontal):
    """The loading line: hidden once a load ended. ``error`` holds the last load's failure (None
    while loading or once loaded); ``state`` the latest progress (text, fraction or None)."""

    def __init__(self, factory: SessionFactory, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.factory = factory
        self.generation = 0
        self.running = False
        self.error: str | None = None
        self.state: tuple[str, float | None] = ("Starting", None)

    def compose(self) -> ComposeResult:
        yield Label("", id="loading-text")
        yield ProgressBar(id="loading-bar", show_eta=False, show_percentage=False)

    def start(self, config: Config) -> None:
        """Load ``config``'s pair; a load still running becomes stale."""
        self.generation += 1
        self.running = True
        self.error = None
        self.state = ("Starting", None)
        self.display = True
        self.query_one("#loading-text", Label).update("Loading the models…")
        self.query_one("#loading-bar", ProgressBar).update(total=None, progress=0)
        self._load(config, self.generation)

    def say_quitting(self) -> None:
        self.query_one("#loading-text", Label).update(
            "Quitting when the models have loaded (a load cannot be interrupted)…")

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, config: Config, generation: int) -> None:
        def progress(message: str, fraction: float | None) -> None:
            self.post_message(LoadProgress(message, fraction, generation))

        try:
            session = self.factory(config, progress)
        except Exception as error:  # every failure becomes a readable message, never a traceback
            self.post_message(LoadFailed(describe_error(error), generation))
        else:
            self.post_message(SessionLoaded(session, generation))

    def on_load_progress(self, message: LoadProgress) -> None:
        if message.generation != self.generation or not self.running:
            message.stop()
            return
        self.state = (message.text, message.fraction)
        percent = f"  {message.fraction:.0%}" if message.fraction is not None else "…"
        self.query_one("#loading-text", Label).update(Text(message.text + percent))
        bar = self.query_one("#loading-bar", ProgressBar)
        if message.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=message.fraction)

    def on_session_loaded(self, message: SessionLoaded) -> None:
        if message.generation != self.generation:
            message.stop()
            message.session.close()
            return
        self.running = False
        self.display = False

    def on_load_failed(self, message: LoadFailed) -> None:
        if message.generation != self.generation:
            message.stop()
            return
        self.running = False
        self.error = message.error
        self.display = False
