"""The chats screen (ctrl+o): the saved chats, opened, renamed, deleted and exported there, and
searched (``/``): every chat's messages, the matching line shown with its words highlighted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from chatapp.chat.chats import ChatSummary, SavedChats, SearchHit
from chatapp.chat.terminal_text import printable, printable_line
from chatapp.errors import UserFacingError

# What the chats screen returns: ("open", chat id, the message to show or None), ("new", 0,
# None), or None (closed).
ChatChoice = tuple[str, int, int | None]

# The marks the search puts around each matching word of a snippet (split off before showing).
MARKS = ("\x02", "\x03")


def hit_text(hit: SearchHit) -> Text:
    """A search result: the chat's title, then who wrote the message and its matching line,
    each matching word highlighted."""
    text = Text(printable_line(hit.title) or "(untitled)", style="bold")
    text.append(f"\n  {'You' if hit.role == 'user' else 'Assistant'}: ", style="dim")
    start, end = MARKS
    for index, part in enumerate(hit.snippet.split(start)):
        word, _, rest = part.partition(end) if index else ("", "", part)
        text.append(printable(word), style="reverse bold")
        text.append(printable(rest))
    return text


class TitleDialog(ModalScreen[str | None]):
    """Asks for a chat's new title: Enter returns it, Esc returns None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old_title = title

    def compose(self) -> ComposeResult:
        with Vertical(id="title-box", classes="dialog"):
            yield Label("Rename the chat", classes="dialog-title")
            yield Input(self.old_title, id="title-input", placeholder="The chat's new title")
            yield Label("Enter renames · Esc keeps the old title", classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChatListScreen(ModalScreen[ChatChoice | None]):
    """Saved chats. Returns a ``ChatChoice``; renames, deletes and exports in place, through the
    conversation's ``SavedChats``. ``/`` goes to the search box at the top: while it holds text,
    the list shows the messages of every chat that match it (Enter opens the chat at that
    message), and Esc empties it."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("slash", "search", "Search"),
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export to Markdown"),
    ]

    def __init__(self, chats: SavedChats, current_chat: int | None,
                 export_dir: Path | None = None) -> None:
        super().__init__()
        self.chats = chats
        self.current_chat = current_chat
        self.export_dir = export_dir
        self._armed_delete: int | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box", classes="dialog"):
            yield Label("Chats", classes="dialog-title")
            yield Input(id="chat-search", placeholder="/ search every chat")
            yield OptionList(id="chat-list")
            yield Label("", id="chats-status")
            yield Label("Enter open · / search · n new · r rename · d delete · e export to "
                        "Markdown · Esc close", classes="dialog-hint")

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(OptionList).focus()

    @property
    def search_text(self) -> str:
        """The search box's text, stripped ("" when not searching)."""
        return self.query_one("#chat-search", Input).value.strip()

    def refresh_list(self, highlight: int | None = None) -> None:
        """Show the chats, or the search's results while the search box holds text."""
        if self.search_text:
            self.show_hits(highlight)
            return
        options = self.query_one(OptionList)
        options.clear_options()
        chats = self.chats.list_chats()
        for chat in chats:
            options.add_option(Option(self._describe(chat), id=str(chat.id)))
        if not chats:
            options.add_option(Option("No saved chats yet. Press n for a new chat.",
                                      disabled=True))
        elif highlight is not None:
            options.highlighted = min(highlight, len(chats) - 1)
        else:
            ids = [c.id for c in chats]
            options.highlighted = ids.index(self.current_chat) if self.current_chat in ids else 0

    def show_hits(self, highlight: int | None = None) -> None:
        """The messages of every chat that match the search box's text, the best first."""
        options = self.query_one(OptionList)
        options.clear_options()
        try:
            hits = self.chats.search(self.search_text, mark=MARKS)
        except UserFacingError as error:
            self._say(str(error))
            return
        for hit in hits:
            options.add_option(Option(hit_text(hit), id=f"{hit.chat_id}:{hit.message_id}"))
        if not hits:
            options.add_option(Option("No message matches. Esc clears the search.",
                                      disabled=True))
        else:
            options.highlighted = min(highlight or 0, len(hits) - 1)
        self._say(f"{len(hits)} message{'s' * (len(hits) != 1)} found." if hits else "")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._armed_delete = None
        self.refresh_list()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the search box: to the results (the first highlighted)."""
        event.stop()
        options = self.query_one(OptionList)
        if options.option_count and self._highlighted() is not None:
            options.focus()

    def action_search(self) -> None:
        self.query_one("#chat-search", Input).focus()

    def _describe(self, chat: ChatSummary) -> Text:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated_at))
        current = "  (open)" if chat.id == self.current_chat else ""
        title = printable_line(chat.title)  # a history from anywhere: show it safely
        text = Text(title or "(untitled)", style="bold")
        text.append(current)
        count = f"{chat.message_count} message" + ("" if chat.message_count == 1 else "s")
        text.append(f"\n  {count} · {stamp}", style="dim")
        if chat.target:
            text.append(printable(f" · {chat.draft} → {chat.target}"), style="dim")
        return text

    def _highlighted(self) -> tuple[int, int | None] | None:
        """The highlighted chat and, for a search result, its message; None for none."""
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        if not option.id:
            return None
        chat, _, message = option.id.partition(":")
        return int(chat), int(message) if message else None

    def _highlighted_chat(self) -> int | None:
        highlighted = self._highlighted()
        return highlighted[0] if highlighted else None

    def _say(self, text: str) -> None:
        self.query_one("#chats-status", Label).update(Text(text))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        highlighted = self._highlighted()
        if highlighted is not None:
            self.dismiss(("open", *highlighted))

    def action_close(self) -> None:
        """Esc: empty the search box (back to the chats), else close."""
        search = self.query_one("#chat-search", Input)
        if search.value:
            search.value = ""
            self.query_one(OptionList).focus()
            return
        self.dismiss(None)

    def action_new(self) -> None:
        self.dismiss(("new", 0, None))

    def action_rename(self) -> None:
        """Ask for a new title for the highlighted chat, then give it that title."""
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        self._armed_delete = None
        try:
            chat = self.chats.get(chat_id)
        except UserFacingError as error:
            self._say(str(error))
            return

        def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                stored = self.chats.rename(chat.id, title)
            except UserFacingError as error:
                self._say(str(error))
                return
            self.refresh_list(highlight=self.query_one(OptionList).highlighted)
            self._say(f"Renamed to {stored}.")

        self.app.push_screen(TitleDialog(chat.title), renamed)

    def action_delete(self) -> None:
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        if self._armed_delete != chat_id:
            self._armed_delete = chat_id
            self._say("Press d again to delete this chat for good.")
            return
        index = self.query_one(OptionList).highlighted
        self._armed_delete = None
        try:
            self.chats.delete(chat_id)
        except UserFacingError as error:
            self._say(str(error))
            return
        self._say("Chat deleted.")
        self.refresh_list(highlight=index)

    def action_export(self) -> None:
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        try:
            path = self.chats.export_markdown(chat_id, self.export_dir)
        except UserFacingError as error:
            self._say(str(error))
            return
        self._say(f"Exported to {path}")
        self.notify(f"Exported to {path}", title="Chat exported", timeout=10, markup=False)


def export_markdown(app: App[Any], chats: SavedChats, chat_id: int,
                    export_dir: Path | None) -> Path | None:
    """Export chat ``chat_id`` to Markdown in ``export_dir``, and tell the user where (or why
    not) in a notification of ``app``; the file's path, None when it failed."""
    try:
        path = chats.export_markdown(chat_id, export_dir)
    except UserFacingError as error:
        app.notify(str(error), severity="error", markup=False)
        return None
    app.notify(f"Exported to {path}", title="Chat exported", timeout=10, markup=False)
    return path
