"""The chat view: the message list, the loading line, the legend, the message box, and the reply
streaming into the list (the live turn).

``ChatView`` owns what the user reads and types. It asks its conversation (``chat``) for every
turn (``begin``, ``regenerate``, ``edit``), runs ``chat.stream`` in a worker thread that posts the
events in ``ReplyEvents`` of whole speculation steps (never per character; steps close together
in one, see ``post_reply``), applies them to the
turn on the UI thread as they come (``Turn.apply``: the one path every front end takes), and ends
the turn through the conversation (``finish`` / ``fail``). What they added is shown at a pace, not
per step (the engine decodes on the same CPU): the text at most ``FRAMES_PER_S`` times a second,
the figures (the reply's header, and through ``Changed`` the status line and the stats panel) at
most ``FIGURES_PER_S``; all of it at once when the turn ends. Views follow the conversation's
messages (``MessageList.sync``).

The app calls its methods (what the keys do, ``open_chat``, ``models_loaded``) and hears from it
through messages: ``ChatView.Changed`` when a turn, a replay, an edit or the chat shown started or
ended (``step`` True: a step of the live turn was shown), so that the status line, the footer's
keys and the stats panel follow. The conversation refuses an action with a ``UserFacingError``,
which the view shows as a notification.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import get_current_worker

from chatapp.chat.attachments import AttachmentError
from chatapp.chat.context import ContextFullError
from chatapp.chat.conversation import Conversation
from chatapp.chat.events import PromptEvent, PromptProgressEvent, StepEvent
from chatapp.chat.mentions import read_mentions
from chatapp.chat.turns import ChatEntry, ChatEvent, PlanEvent, ReplayJob, Turn
from chatapp.errors import UserFacingError
from chatapp.tui.chat_input import ChatInput
from chatapp.tui.errors import describe_error
from chatapp.tui.loading import ModelLoader, SessionFactory
from chatapp.tui.message_list import MessageList
from chatapp.tui.messages import ReplayDone, ReplyEvents, ReplyFailed, post_reply
from chatapp.tui.pacer import Pacer
from chatapp.tui.token_text import Legend
from chatapp.tui.widgets import MessageView, Note

WELCOME = ("Ask anything. The small draft model proposes tokens, the target verifies them: each "
           "token is coloured by where it came from (legend below). ctrl+↑/ctrl+↓ change the "
           "draft length K while a reply streams, F2 shows the statistics, F1 all keys.")
FRAMES_PER_S = 10  # the most a streaming reply's text is shown again, per second
FIGURES_PER_S = 2  # the same for its figures: the header, the status line, the stats panel


class ChatView(Vertical):
    """The chat (see the module docstring). ``pending``: a message sent while the models load;
    ``editing``: the user message that Enter resends in its place."""

    class Changed(Message):
        """What the view shows changed: a turn, a replay, an edit, the chat (``step`` False:
        the keys in force may have changed too) or a step of the live turn (``step`` True)."""

        def __init__(self, step: bool = False) -> None:
            super().__init__()
            self.step = step

    def __init__(self, chat: Conversation, factory: SessionFactory, *,
                 folder: Path | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.chat = chat
        self.factory = factory
        self.folder = folder  # where @paths start (None: the current folder)
        self.highlight = True
        self.pending: str | None = None
        self.editing: ChatEntry | None = None
        self._text_before_edit = ""
        self._unshown: list[ChatEvent] = []  # the live turn's events applied, not shown yet
        self._shown_pieces = 0  # how many of the live turn's pieces its view shows
        self._live: Turn | None = None  # the turn those two are about
        self._text_pace = Pacer(self, 1 / FRAMES_PER_S, self._show_unshown)
        self._figures_pace = Pacer(self, 1 / FIGURES_PER_S, self._show_figures)

    def compose(self) -> ComposeResult:
        yield MessageList(id="conversation")
        yield ModelLoader(self.factory, id="loading")
        yield Legend(id="legend")
        yield ChatInput(folder=self.folder, id="input")

    @property
    def message_list(self) -> MessageList:
        return self.query_one("#conversation", MessageList)

    @property
    def chat_input(self) -> ChatInput:
        return self.query_one("#input", ChatInput)

    @property
    def loader(self) -> ModelLoader:
        return self.query_one("#loading", ModelLoader)

    def _changed(self) -> None:
        self.post_message(self.Changed())

    # -- the chat shown -------------------------------------------------------------------------

    async def open_chat(self, chat_id: int | None) -> None:
        """Show saved chat ``chat_id`` (None: a new chat); a reply still streaming is stopped
        and saved to its own chat."""
        entries = self.chat.open_chat(chat_id)
        self.editing = None
        message_list = self.message_list
        message_list.selected = None
        await message_list.remove_children()
        if entries:
            await message_list.mount_all([MessageView.of(e, self.highlight) for e in entries])
            message_list.scroll_end(animate=False)
        else:
            message_list.mount(Note(WELCOME, "welcome", id="welcome"))
        self.chat_input.focus()
        self._changed()

    def add_note(self, text: str, kind: str = "warning") -> None:
        self.message_list.mount(Note(text, kind))

    def set_highlighting(self, on: bool) -> None:
        """The replies' Markdown with token colours (True) or without (False)."""
        self.highlight = on
        for view in self.message_list.views:
            view.set_highlighting(on)
        self.query_one(Legend).show_colours(on)

    # -- the models -----------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Load the conversation's pair (the loader's messages go up to the app)."""
        for note in self.query("#load-error"):
            note.remove()
        self.loader.start(self.chat.config)

    def models_loaded(self) -> None:
        """The conversation has its models: a message sent while they loaded goes now."""
        if self.pending is not None:
            text, self.pending = self.pending, None
            folder = self.chat_input.folder
            if self.start_turn(lambda: self.chat.begin(*read_mentions(text, folder)),
                               queued=True) is None:
                self.pending = text
                self._unqueue_pending()

    def load_failed(self, error: str) -> None:
        """Say why the models could not be loaded; a waiting message goes back to the box."""
        self.message_list.mount(Note(
            f"The models could not be loaded.\n{error}\nPress ctrl+r to try again, or F4 to "
            "change the models.", "error", id="load-error"), before=0)
        if self.pending is not None:
            self._unqueue_pending()

    # -- sending --------------------------------------------------------------------------------

    def on_chat_input_submitted(self, message: ChatInput.Submitted) -> None:
        """Send the typed message with the files its ``@path`` words name (an edit goes as
        typed); a file that cannot be attached is refused and the text stays in the box."""
        text = message.text
        if not text.strip() or not self._can_send():
            return
        edited = self.editing
        try:
            bare, files = (text, []) if edited else read_mentions(text, self.chat_input.folder)
        except AttachmentError as error:
            self._refused(error)
            return
        self.chat_input.clear()
        if self.chat.session is None:
            self._queue(text, MessageView("user", bare, attachments=files))
            return
        self.editing = None
        make = (lambda: self._resend_edited(edited, text)) if edited else (
            lambda: self.chat.begin(bare, files))
        if self.start_turn(make) is None:  # refused: the text and the edit stay
            self.editing = edited
            self.chat_input.restore(text)

    def _refused(self, error: UserFacingError) -> None:
        """A message that cannot go as it is: said in the chat and as a notification."""
        self.message_list.add(Note(str(error), "error"))
        self.notify(str(error), title="Not sent", severity="error", timeout=10, markup=False)

    def _can_send(self) -> bool:
        """Whether a message can be sent (or queued) now; if not, the user is told why."""
        refusal = self._refusal()
        if refusal is not None:
            text, severity = refusal
            self.notify(text, severity=severity)
        return refusal is None

    def _refusal(self) -> tuple[str, SeverityLevel] | None:
        chat = self.chat
        if chat.turn is not None:
            if chat.turn.cancel.is_set():
                return "The last reply is stopping; send again in a moment.", "information"
            return "A reply is still streaming: Esc stops it.", "warning"
        if self.pending is not None:
            return "Your last message is waiting for the models.", "warning"
        if chat.session is None and self.loader.error is not None:
            return "The models are not loaded: ctrl+r tries again, F4 changes them.", "error"
        if chat.session is None and self.editing is not None:
            return "The models are loading: press Enter again once they are ready.", "warning"
        return None

    def _queue(self, text: str, view: MessageView) -> None:
        """Keep a message sent while the models load (``view`` shows it); it is sent (its files
        read again) once they are ready."""
        self.pending = text
        view.add_class("-queued")
        self.message_list.add(view)
        self.notify("Sending as soon as the models are loaded.", timeout=4)
        self._changed()  # Esc takes it back

    def _unqueue_pending(self) -> None:
        text, self.pending = self.pending or "", None
        for view in self.query(".-queued"):
            view.remove()
        self.chat_input.restore(text)

    def _resend_edited(self, entry: ChatEntry, text: str) -> Turn:
        turn, backup = self.chat.edit(entry, text)
        if backup:
            self.notify(f'The chat as it was is kept as "{backup}" in the chats (ctrl+o).',
                        title="Message edited", timeout=8, markup=False)
        return turn

    # -- the live turn --------------------------------------------------------------------------

    def start_turn(self, make: Callable[[], Turn], queued: bool = False) -> Turn | None:
        """Start the turn ``make`` asks the conversation for, show it and stream it; None (and
        a notification) when the conversation refuses."""
        try:
            turn = make()
        except AttachmentError as error:
            self._refused(error)
            return None
        except UserFacingError as error:
            self.notify(str(error), severity="warning", markup=False)
            if isinstance(error, ContextFullError):  # refused: say it where the user looks
                self.add_note(str(error), "error")
            return None
        if queued:
            for view in self.query(".-queued"):
                view.remove_class("-queued")
                view.entry = turn.user_entry
        message_list = self.message_list
        message_list.sync(self.chat.entries, self.highlight)
        message_list.add(MessageView("assistant", k_label=turn.k_label(),
                                     highlight=self.highlight, turn=turn,
                                     target_rpc=self.chat.config.rpc))
        message_list.selected = None
        self._changed()
        self._stream(turn)
        return turn

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _stream(self, turn: Turn) -> None:
        """(Worker thread.) Post ``turn``'s events to the view (``post_reply``)."""
        worker = get_current_worker()
        post_reply(self.chat.stream(turn), turn, self.post_message, lambda: worker.is_cancelled,
                   1 / FRAMES_PER_S)

    def on_reply_events(self, message: ReplyEvents) -> None:
        """Apply the events to their turn, show what they added (at the pace, see the module
        docstring), and end the turn through the conversation once it is done."""
        turn = message.turn
        if turn is not self._live:
            self._live, self._unshown, self._shown_pieces = turn, [], 0
        for event in message.events:
            turn.apply(event)
        self._unshown += message.events
        running = self.app.is_running
        if turn.done:
            if running:
                self._show_unshown()
            self._end_live()
            entry = self.chat.finish(turn)
            if not running:  # quitting: it is saved, leave the widgets alone
                return
            view = self.message_list.view_of(turn)
            if view is not None:
                view.finish(entry)
            self._changed()
        elif running:
            self._text_pace.ask()

    def _show_unshown(self) -> None:
        """Show the live turn's events not shown yet: the plan's notes and the new pieces (the
        figures follow at their own pace)."""
        turn, events = self._live, self._unshown
        self._unshown = []
        view = self.message_list.view_of(turn) if turn is not None else None
        if view is None:
            return
        for event in events:
            if isinstance(event, PlanEvent):
                self._show_plan(view, event)
        if any(isinstance(event, (PromptProgressEvent, PromptEvent)) for event in events):
            view.update_header()  # how much of a long prompt is read, until it is
        pieces = turn.pieces[self._shown_pieces:]
        self._shown_pieces += len(pieces)
        if pieces:
            view.append(pieces)
        if pieces or any(isinstance(event, StepEvent) for event in events):
            self._figures_pace.ask()

    def _show_figures(self) -> None:
        """The live turn's figures as of its latest step: its header, and (``Changed``) the
        status line and the stats panel."""
        turn = self._live
        view = self.message_list.view_of(turn) if turn is not None else None
        if view is None:
            return
        view.k_label = turn.k_label()
        view.update_header(turn.stats())
        self.post_message(self.Changed(step=True))

    def _end_live(self) -> None:
        """The live turn ended: nothing of it waits to be shown any more."""
        self._text_pace.cancel()
        self._figures_pace.cancel()
        self._live, self._unshown, self._shown_pieces = None, [], 0

    def _show_plan(self, view: MessageView, plan: PlanEvent) -> None:
        """What the user should know about the prompt: messages left out, a template note."""
        if plan.dropped_messages:  # where the model's view begins now
            self.message_list.mark_view_start(self.chat.entries, plan.dropped_messages)
        if plan.note:
            self.message_list.mount(Note(plan.note, "warning"), before=view)

    def on_reply_failed(self, message: ReplyFailed) -> None:
        turn = message.turn
        running = self.app.is_running
        if turn is self._live:
            if running:
                self._show_unshown()
            self._end_live()
        view = self.message_list.view_of(turn) if running else None
        kept = self.chat.fail(turn)
        if not running:
            return
        if kept is not None and view is not None:
            view.finish(kept)
        elif kept is None:
            if view is not None:
                view.remove()
            self.message_list.sync(self.chat.entries, self.highlight)
            if turn.user_entry is not None:
                self.chat_input.restore(turn.user_text)
        self._changed()
        title = "Message too long" if turn.not_sent else "The reply failed"
        if view is not None:
            note = message.error if turn.not_sent else f"The reply failed. {message.error}"
            self.message_list.mount(Note(note, "error"))
        self.notify(message.error, title=title, severity="error", timeout=10, markup=False)

    def stop(self) -> None:
        """Esc: stop the reply or the replay; take back a message waiting for the models;
        cancel an edit (the text typed before it comes back)."""
        chat = self.chat
        if chat.turn is not None:
            chat.turn.cancel.set()
        elif chat.replaying is not None:
            chat.replaying.cancel.set()
        elif self.pending is not None:
            self._unqueue_pending()
        elif self.editing is not None:
            self.editing = None
            self.chat_input.show_text(self._text_before_edit)
            self.notify("Edit cancelled.", timeout=3)
        self._changed()

    # -- what the user does with the messages ---------------------------------------------------

    def regenerate(self, new_seed: bool = False) -> None:
        """The last reply again (``new_seed``: from a fresh random seed)."""
        turn = self.start_turn(lambda: self.chat.regenerate(new_seed))
        if turn is not None and new_seed:
            self.notify(f"Regenerating with the new seed {turn.meta['seed']}.", timeout=4)

    def edit_message(self) -> None:
        """Put the selected (or last) user message in the message box; Enter resends it."""
        entry = self.message_list.picked_entry(self.chat.entries, "user")
        if entry is None:
            self.notify("There is no message of yours to edit yet.", severity="warning")
            return
        if self.chat.busy:
            self.notify("Wait for the reply to end (Esc stops it), then edit.",
                        severity="warning")
            return
        if self.editing is None:
            self._text_before_edit = self.chat_input.text
        self.editing = entry
        self.chat_input.show_text(entry.content)
        self.chat_input.focus()
        self.notify("Editing your message: Enter resends it and replaces the later turns; "
                    "Esc cancels.", timeout=6)
        self._changed()

    def replay(self) -> None:
        """Decode the selected (or last) reply again with the target alone, to measure what
        speculation bought on it; the result goes to the reply's statistics."""
        view = self.message_list.reply_view()
        if view is None or view.entry is None:
            self.notify("There is no finished reply to replay yet.", severity="warning")
            return
        try:
            job = self.chat.prepare_replay(view.entry)
        except UserFacingError as error:
            self.notify(str(error), severity="warning", markup=False)
            return
        self.notify("Replaying this reply at K 0 (the target alone) to measure its speedup; "
                    "Esc stops.", timeout=5)
        self._changed()
        self._run_replay(job)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False)
    def _run_replay(self, job: ReplayJob) -> None:
        try:
            self.post_message(ReplayDone(job, self.chat.run_replay(job)))
        except Exception as error:  # shown as a notification, never a traceback
            self.post_message(ReplayDone(job, None, describe_error(error)))

    def on_replay_done(self, message: ReplayDone) -> None:
        self.chat.end_replay(message.job, message.result)
        if not self.app.is_running:
            return
        if message.error:
            self.notify(message.error, title="The replay failed", severity="error",
                        timeout=10, markup=False)
        elif message.result is None:
            self.notify("Replay stopped.", timeout=3)
        else:
            self.notify(f"{message.result.summary()} ({message.job.entry.replay_basis})",
                        title="Replay at K 0", timeout=10, markup=False)
        self._changed()
