"""Loading the models in a worker thread, with progress, failures and a message sent early.

``LoadingMixin`` is part of ``SpecChatApp``: the session comes from ``session_factory(config,
progress)`` in a worker; the loaded session goes to the app's conversation (``chat.attach``).
A message sent while loading waits (``pending``) and is sent once the models are ready.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.widgets import Label, ProgressBar

from chatapp.settings.config import Config
from chatapp.tui.errors import describe_error
from chatapp.tui.messages import LoadFailed, LoadProgress, SessionLoaded
from chatapp.tui.widgets import Note


class LoadingMixin:
    """Loads the pair; shows the progress bar and what went wrong."""

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
        self._load_session(self.chat.config, self._load_generation)

    @property
    def is_loading(self) -> bool:
        return self.chat.session is None and self.load_error is None

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
        if self.chat.session is not None or not self.is_running:
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
            message.session.close()
            return
        self.chat.attach(message.session)
        if self._quit_when_loaded:
            self.exit()
            return
        self.query_one("#loading").display = False
        self._tell_runtime_notes(message.session.notes)
        self.update_status()
        if self.pending is not None:
            text, self.pending = self.pending, None
            self.start_turn(lambda: self.chat.begin(text), queued=True)

    def _tell_runtime_notes(self, notes: tuple[str, ...]) -> None:
        """Each note once per app run: in the conversation, and on stderr when the app exits."""
        for note in notes:
            if note not in self.told_notes:
                self.told_notes.append(note)
                self.message_list.mount(Note(note, "warning"))

    def on_load_failed(self, message: LoadFailed) -> None:
        if message.generation != self._load_generation or not self.is_running:
            return
        self.load_error = message.error
        if self._quit_when_loaded:
            self.exit()
            return
        self.query_one("#loading").display = False
        self.message_list.mount(Note(
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

    def on_quit_while_loading(self) -> None:
        self.query_one("#loading-text", Label).update(
            "Quitting when the models have loaded (a load cannot be interrupted)…")

    def action_reload(self) -> None:
        if self.chat.busy:
            self.notify("Stop the reply first (Esc), then reload.", severity="warning")
            return
        self.chat.release()
        self.start_loading()
