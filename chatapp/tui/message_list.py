"""The list of messages: one ``MessageView`` per message of the open chat, the selection, which
message an action on "the selected or the latest" one means, and copying a message or its code.

The list shows what the chat view hands it and follows the conversation's messages
(``sync``); it never changes the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from chatapp.chat.context import view_start_note
from chatapp.chat.events import TurnStats
from chatapp.chat.turns import ChatEntry, Turn
from chatapp.tui.chat_input import ChatInput
from chatapp.tui.stats_view import TurnInfo
from chatapp.tui.widgets import MessageView, Note

# A fenced Markdown code block: ``` or ~~~, an optional language, the code, the same fence
# (or the end of the text: a reply stopped or cut at max tokens leaves its last block open).
CODE_BLOCK = re.compile(r"^ *(```|~~~)[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^ *\1[ \t]*$|\Z)",
                        re.MULTILINE | re.DOTALL)


def last_code_block(text: str) -> tuple[str, str] | None:
    """The last fenced code block of ``text`` as (language or "", code), or None if none; a
    block the text ends in before its closing fence counts."""
    blocks = CODE_BLOCK.findall(text)
    if not blocks:
        return None
    _fence, language, code = blocks[-1]
    return language, code.rstrip("\n")


class MessageList(VerticalScroll, can_focus=True):
    """The messages. Focus it (Tab) and use up/down to select one; the stats panel follows. The
    keys on a message: copy it (c), copy its code (b), and the app's edit (e) and replay (z) of
    the selected message."""

    BINDINGS = [
        Binding("up,k", "select(-1)", "Previous message", show=False),
        Binding("down,j", "select(1)", "Next message", show=False),
        Binding("home", "select_edge(0)", "First message", show=False),
        Binding("end", "select_edge(-1)", "Last message", show=False),
        Binding("enter,escape", "back_to_input", "Back to the message box", show=False),
        Binding("question_mark", "app.help", "Help", show=False),
        Binding("c", "copy_message", "Copy"),
        Binding("b", "copy_code", "Copy code"),
        Binding("e", "app.edit_message", "Edit"),
        Binding("z", "app.replay", "Replay K0"),
    ]

    selected: reactive[MessageView | None] = reactive(None, init=False)

    class SelectionChanged(Message):
        def __init__(self, view: MessageView | None) -> None:
            super().__init__()
            self.view = view

    @property
    def views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    # -- showing --------------------------------------------------------------------------------

    def add(self, *widgets: Widget, before: Widget | None = None) -> None:
        """Mount ``widgets`` at the end (or ``before`` one) and follow the end again: the
        user acted. The welcome note leaves with the first message."""
        for welcome in self.query("#welcome"):
            welcome.remove()
        self.mount(*widgets, before=before)
        if before is None:
            self.scroll_end(animate=False)

    def sync(self, entries: Sequence[ChatEntry], highlight: bool) -> None:
        """Follow the conversation's ``entries``: a message it dropped loses its view, a
        message it gained gets one (at the end)."""
        shown: set[int] = set()
        for view in self.views:
            if view.entry is None:
                continue
            if view.entry in entries:
                shown.add(id(view.entry))
            else:
                view.remove()
        new = [MessageView.of(entry, highlight) for entry in entries if id(entry) not in shown]
        if new:
            self.add(*new)

    def mark_view_start(self, entries: Sequence[ChatEntry], left_out: int) -> None:
        """The note that the model's view begins here, before the first of ``entries`` it reads
        (the ``left_out`` before it are out of its view; after them all when it reads none of
        them, only the next message); no note when it reads them all."""
        for marker in self.query(".view-start"):
            marker.remove()
        first = entries[left_out] if 0 < left_out < len(entries) else None
        before = next((view for view in self.views if view.entry is first), None)
        if left_out and (first is None or before is not None):
            note = Note(view_start_note(left_out), "warning")
            note.add_class("view-start")
            self.mount(note, before=before)

    def show_message(self, message_id: int) -> None:
        """Select the view of saved message ``message_id`` and scroll to it (once laid out);
        nothing when it is not shown."""
        view = next((v for v in self.views if v.entry and v.entry.message_id == message_id),
                    None)
        if view is not None:
            self.selected = view
            self.call_after_refresh(self.scroll_to_widget, view, animate=False, top=True)

    def view_of(self, turn: Turn) -> MessageView | None:
        """The view ``turn`` streams into, while its chat is shown."""
        return next((view for view in self.views if view.turn is turn), None)

    # -- picking --------------------------------------------------------------------------------

    def picked_entry(self, entries: Sequence[ChatEntry], role: str) -> ChatEntry | None:
        """The selected message if it has ``role``; for a selected message of the other role
        the one before it; else the last of ``entries`` with ``role``."""
        entries = list(entries)
        selected = self.selected
        if selected is not None and selected.entry in entries:
            earlier = entries[:entries.index(selected.entry) + 1]
            return next((e for e in reversed(earlier) if e.role == role), None)
        return next((e for e in reversed(entries) if e.role == role), None)

    def reply_view(self) -> MessageView | None:
        """The reply an action or the stats panel means: the selected one (a selected user
        message means the reply to it), else the live one, else the latest."""
        views = self.views
        replies = [v for v in views if v.role == "assistant"]
        if self.selected in views:
            following = [v for v in views[views.index(self.selected):] if v.role == "assistant"]
            if following:
                return following[0]
        live = next((v for v in replies if v.live), None)
        return live or (replies[-1] if replies else None)

    def reply_stats(self) -> tuple[TurnStats | None, TurnInfo] | None:
        """What the stats panel shows: the selected reply, else the live one, else the latest
        (its statistics, live ones while it streams, and which turn it is); None: no reply."""
        view = self.reply_view()
        if view is None:
            return None
        replies = [v for v in self.views if v.role == "assistant"]
        number = replies.index(view) + 1 if view in replies else len(replies)
        stats = view.turn.stats() if view.live and view.turn is not None else view.stats
        entry = view.entry
        return stats, TurnInfo(f"Turn {number}", view.k_label, view.finish_reason, view.live,
                               view.target_rpc, entry.replay if entry else None,
                               entry.replay_basis if entry else "")

    def _copy_view(self) -> MessageView | None:
        """The selected message, else the last reply."""
        views = self.views
        if self.selected in views:
            return self.selected
        return next((v for v in reversed(views) if v.role == "assistant"), None)

    # -- keys -----------------------------------------------------------------------------------

    def action_select(self, delta: int) -> None:
        views = self.views
        if not views:
            return
        if self.selected not in views:
            index = len(views) - 1 if delta < 0 else 0
        else:
            index = max(0, min(len(views) - 1, views.index(self.selected) + delta))
        self.selected = views[index]

    def action_select_edge(self, index: int) -> None:
        views = self.views
        if views:
            self.selected = views[index]

    def action_back_to_input(self) -> None:
        self.selected = None
        self.screen.query_one(ChatInput).focus()

    def action_copy_message(self) -> None:
        """Copy the selected message, else the last reply, to the clipboard."""
        view = self._copy_view()
        if view is None or not view.plain:
            self.notify("There is no message to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(view.plain)
        what = "your message" if view.role == "user" else "the reply"
        self.notify(f"Copied {what} ({len(view.plain)} characters) to the clipboard.",
                    timeout=4)

    def action_copy_code(self) -> None:
        """Copy the last code block of the selected message, else of the last reply."""
        view = self._copy_view()
        block = last_code_block(view.plain) if view is not None else None
        if block is None:
            self.notify("That message has no code block.", severity="warning")
            return
        language, code = block
        lines = code.count("\n") + 1
        kind = f"{language} " if language else ""
        self.app.copy_to_clipboard(code)
        self.notify(f"Copied the {kind}code block ({lines} line{'s' * (lines != 1)}) to the "
                    "clipboard.", timeout=4, markup=False)

    def watch_selected(self, old: MessageView | None, new: MessageView | None) -> None:
        if old is not None:
            old.remove_class("-selected")
        if new is not None:
            new.add_class("-selected")
            self.scroll_to_widget(new, animate=False)
        self.post_message(self.SelectionChanged(new))

    def on_message_view_selected(self, message: MessageView.Selected) -> None:
        self.selected = message.view
