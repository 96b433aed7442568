"""Sending a message and streaming the reply into the message list.

``RepliesMixin`` is part of ``SpecChatApp``. The conversation (``self.chat``) makes every turn;
this module starts it, runs ``chat.stream`` in a worker that posts the events in one message per
speculation step (never per character), applies them to the turn (``Turn.apply``), renders what
they added, and ends the turn through the conversation (``finish`` / ``fail``). Views follow the
conversation's messages (``_sync_views``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import work
from textual.worker import get_current_worker

from chatapp.chat.events import StepEvent, TokenEvent
from chatapp.chat.turns import ChatEntry, ChatEvent, Piece, PlanEvent, Turn
from chatapp.errors import UserFacingError
from chatapp.tui.chat_input import ChatInput
from chatapp.tui.errors import describe_error
from chatapp.tui.messages import ReplyEvents, ReplyFailed
from chatapp.tui.widgets import MessageView, Note


class RepliesMixin:
    """The message box's Enter, the reply's stream, Esc, and the edit that Enter resends."""

    editing: ChatEntry | None
    _text_before_edit: str

    def on_chat_input_submitted(self, message: ChatInput.Submitted) -> None:
        text = message.text
        if not text.strip():
            return
        chat = self.chat
        if chat.turn is not None:
            if chat.turn.cancel.is_set():
                self.notify("The last reply is stopping; send again in a moment.")
            else:
                self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return
        if self.pending is not None:
            self.notify("Your last message is waiting for the models.", severity="warning")
            return
        if chat.session is None and self.load_error is not None:
            self.notify("The models are not loaded: ctrl+r tries again, F4 changes them.",
                        severity="error")
            return
        if chat.session is None and self.editing is not None:
            self.notify("The models are loading: press Enter again once they are ready.",
                        severity="warning")
            return
        self.chat_input.clear()
        if chat.session is None:
            self._queue(text)
            return
        edited, self.editing = self.editing, None
        make = (lambda: self._resend_edited(edited, text)) if edited else (
            lambda: chat.begin(text))
        if self.start_turn(make) is None:  # refused: the text and the edit stay
            self.editing = edited
            self.chat_input.restore(text)

    def _queue(self, text: str) -> None:
        """Keep a message sent while the models load; it is sent once they are ready."""
        self.pending = text
        view = MessageView("user", text)
        view.add_class("-queued")
        self._mount_message(view)
        self.notify("Sending as soon as the models are loaded.", timeout=4)

    def _resend_edited(self, entry: ChatEntry, text: str) -> Turn:
        turn, backup = self.chat.edit(entry, text)
        if backup:
            self.notify(f'The chat as it was is kept as "{backup}" in the chats (ctrl+o).',
                        title="Message edited", timeout=8, markup=False)
        return turn

    def start_turn(self, make: Callable[[], Turn], queued: bool = False) -> Turn | None:
        """Start the turn ``make`` asks the conversation for, show it and stream it; None (and
        a notification) when the conversation refuses."""
        try:
            turn = make()
        except UserFacingError as error:
            self.notify(str(error), severity="warning", markup=False)
            return None
        if queued:
            for view in self.query(".-queued"):
                view.remove_class("-queued")
                view.entry = turn.user_entry
        self._sync_views()
        self._mount_message(MessageView("assistant", k_label=turn.k_label(),
                                        highlight=self.highlight, turn=turn,
                                        target_rpc=self.chat.config.rpc))
        self.message_list.selected = None
        self._after_change()
        self._stream_reply(turn)
        return turn

    def _sync_views(self) -> None:
        """The views follow the conversation: a message it dropped loses its view, a message
        it gained gets one (at the end)."""
        entries = self.chat.entries
        shown: set[int] = set()
        for view in self.message_list.views:
            if view.entry is None:
                continue
            if view.entry in entries:
                shown.add(id(view.entry))
            else:
                view.remove()
        new = [MessageView.of(entry, self.highlight) for entry in entries
               if id(entry) not in shown]
        if new:
            self._mount_message(*new)

    def _mount_message(self, *widgets: Any) -> None:
        for welcome in self.query("#welcome"):
            welcome.remove()
        self.message_list.mount(*widgets)
        self.message_list.scroll_end(animate=False)  # the user acted: follow the reply again

    def _view_of(self, turn: Turn) -> MessageView | None:
        """The view a reply streams into, while its chat is shown."""
        return next((view for view in self.message_list.views if view.turn is turn), None)

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _stream_reply(self, turn: Turn) -> None:
        """(Worker thread.) Post ``turn``'s events to the app in order, in batches: the plan
        and the prompt at once, each step's tokens with its ``StepEvent``, the end; a failure
        after the events before it."""
        worker = get_current_worker()
        batch: list[ChatEvent] = []
        try:
            for event in self.chat.stream(turn):
                if worker.is_cancelled:
                    turn.cancel.set()
                batch.append(event)
                if not isinstance(event, TokenEvent):
                    self.post_message(ReplyEvents(turn, batch))
                    batch = []
        except Exception as error:  # shown in the app; the typed text goes back to the input
            if batch:
                self.post_message(ReplyEvents(turn, batch))
            text = describe_error(error)
            if turn.not_sent:
                text = (f"Your message was not sent. {text} (In the app: Settings, F4, "
                        "Context.) Your message is back in the message box.")
            self.post_message(ReplyFailed(turn, text))

    def on_reply_events(self, message: ReplyEvents) -> None:
        """Apply the events to their turn (``Turn.apply``: the one path every front end takes),
        show what they added, and end the turn through the conversation once it is done."""
        turn = message.turn
        view = self._view_of(turn) if self.is_running else None
        shown = len(turn.pieces)
        for event in message.events:
            turn.apply(event)
        if view is not None:
            self._show_events(view, turn, message.events, turn.pieces[shown:])
        if turn.done:
            entry = self.chat.finish(turn)
            if not self.is_running:  # quitting: it is saved, leave the widgets alone
                return
            if view is not None:
                view.finish(entry)
            self._after_change()

    def _show_events(self, view: MessageView, turn: Turn, events: list[ChatEvent],
                     pieces: list[Piece]) -> None:
        """Show a batch of ``turn``'s events, already applied, in its ``view``: the plan's
        notes, the new ``pieces``, and after a step the header, the stats and the status."""
        for event in events:
            if isinstance(event, PlanEvent):
                self._show_plan(view, event)
        stepped = any(isinstance(event, StepEvent) for event in events)
        if pieces or stepped:
            view.k_label = turn.k_label()
            view.append(pieces)
            view.update_header(turn.stats())
        if stepped:
            self._refresh_stats()
            self.update_status()

    def _show_plan(self, view: MessageView, plan: PlanEvent) -> None:
        """What the user should know about the prompt: messages left out, a template note."""
        if plan.dropped_messages:
            n = plan.dropped_messages
            words = "message was" if n == 1 else f"{n} messages were"
            self.message_list.mount(Note(
                f"The oldest {words} left out of the context so that the conversation fits the "
                f"model's window ({self.chat.config.n_ctx} tokens).", "warning"), before=view)
        if plan.note:
            self.message_list.mount(Note(plan.note, "warning"), before=view)

    def on_reply_failed(self, message: ReplyFailed) -> None:
        turn = message.turn
        view = self._view_of(turn) if self.is_running else None
        kept = self.chat.fail(turn)
        if not self.is_running:
            return
        shown = view is not None
        if kept is not None and view is not None:
            view.finish(kept)
        elif kept is None:
            if view is not None:
                view.remove()
            self._sync_views()
            if turn.user_entry is not None:
                self.chat_input.restore(turn.user_text)
        self._after_change()
        title = "Message too long" if turn.not_sent else "The reply failed"
        if shown:
            note = message.error if turn.not_sent else f"The reply failed. {message.error}"
            self.message_list.mount(Note(note, "error"))
        self.notify(message.error, title=title, severity="error", timeout=10, markup=False)

    def _after_change(self) -> None:
        """A turn started or ended: the status, the footer's keys and the stats follow."""
        self.update_status()
        self.refresh_bindings()
        self._refresh_stats()

    def action_stop(self) -> None:
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
        self.update_status()
        self.refresh_bindings()
