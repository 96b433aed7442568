"""The message box: a text area where Enter sends, ctrl+j / shift+enter add a line, Tab after an
``@`` word completes the path of a file to attach, and what is typed is shown safely (controls as
visible symbols) and kept exactly (every kind of line break).
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea
from textual.widgets.text_area import (
    Document,
    DocumentNavigator,
    EditResult,
    Location,
    WrappedDocument,
)

from chatapp.chat.mentions import complete_path, mention, typed_fragment
from chatapp.chat.terminal_text import visible

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class ChatDocument(Document):
    """The message box's text. Lines break at LF, CR LF and CR only, and the text always has LF
    line breaks: terminals paste line breaks as CR (xterm, VTE) or LF, and a message must not
    depend on which. Every other character is kept as it came. (Textual's ``Document`` also breaks
    lines at form feeds, vertical tabs, U+2028 and other separators, losing them, and joins all
    lines with the first line break it saw, so that pasted LF lines could come out as CR LF.)"""

    def __init__(self, text: str) -> None:
        super().__init__("")
        self._newline = "\n"
        self._lines = _LINE_BREAK.split(text)

    def replace_range(self, start: Location, end: Location, text: str) -> EditResult:
        """``Document.replace_range``, with the line breaks above."""
        top, bottom = sorted((start, end))
        top_row, top_column = top
        bottom_row, bottom_column = bottom
        lines = self._lines
        replaced_text = self.get_text_range(top, bottom)
        before = lines[top_row][:top_column] if top_row < len(lines) else ""
        after = lines[bottom_row][bottom_column:] if bottom_row < len(lines) else ""
        insert_lines = _LINE_BREAK.split(text)
        insert_lines[0] = before + insert_lines[0]
        destination_column = len(insert_lines[-1])
        insert_lines[-1] += after
        lines[top_row:bottom_row + 1] = insert_lines
        return EditResult((top_row + len(insert_lines) - 1, destination_column), replaced_text)


class ChatInput(TextArea):
    """The message box: Enter sends, ctrl+j (or shift+enter) starts a new line, Tab right after
    an ``@`` word completes its path (relative to ``folder``; elsewhere Tab moves the focus on).
    It holds what was typed or pasted exactly (line breaks as LF, see ``ChatDocument``) and shows
    control characters as symbols."""

    # F6 is the app's regenerate, not the text area's "select line".
    BINDINGS = [Binding("ctrl+j,shift+enter", "newline", "New line", show=False),
                Binding("f6", "app.regenerate", "Regenerate", show=False)]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, folder: Path | None = None, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder="Message (Enter sends, ctrl+j new line, F1 help)")
        self.folder = folder or Path.cwd()

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
        elif event.key in ("ctrl+j", "shift+enter"):
            # Here, not only through the binding: a binding runs after the keys already queued,
            # so "a", ctrl+j, "b" arriving in one burst (a fast typist, a paste without bracketed
            # paste) would become "ab\n".
            event.stop()
            event.prevent_default()
            self.action_newline()
        elif event.key == "tab" and self.complete_mention():
            event.stop()
            event.prevent_default()
        # Any other key: TextArea._on_key runs next (dispatch walks the MRO).

    def _set_document(self, text: str, language: str | None) -> None:
        super()._set_document(text, language)
        if type(self.document) is Document:  # plain text (always, here): the exact document
            self.document = ChatDocument(text)
            self.wrapped_document = WrappedDocument(self.document, tab_width=self.indent_width)
            self.navigator = DocumentNavigator(self.wrapped_document)
            self.move_cursor((0, 0))
            self._rewrap_and_refresh_virtual_size()

    def get_line(self, line_index: int) -> Text:
        line = super().get_line(line_index)
        shown = visible(self.document.get_line(line_index))  # one symbol per character
        if shown != line.plain:
            line = Text(shown, end=line.end, no_wrap=line.no_wrap)
        return line

    def action_newline(self) -> None:
        start, end = self.selection
        self.replace("\n", start, end, maintain_selection_offset=False)

    def complete_mention(self) -> bool:
        """Complete the ``@`` path before the cursor as far as the matching entries agree (and
        list them when they do not); False when the cursor is not after an ``@`` word."""
        row, column = self.cursor_location
        fragment = typed_fragment(self.document.get_line(row)[:column])
        if fragment is None:
            return False
        completed, names = complete_path(fragment, self.folder)
        if not names:
            self.notify(f"No file matches @{fragment}.", severity="warning", timeout=3,
                        markup=False)
        elif completed != fragment:
            self.insert(completed[len(fragment):])
        elif len(names) > 1:
            shown = "  ".join(names[:40]) + ("  …" if len(names) > 40 else "")
            self.notify(shown, title=f"{len(names)} matches", timeout=6, markup=False)
        return True

    def insert_mention(self, path: str) -> None:
        """Insert the ``@`` word of ``path`` at the cursor, spaced from the words around it."""
        row, column = self.cursor_location
        line = self.document.get_line(row)
        before = " " if column and not line[column - 1].isspace() else ""
        after = "" if column < len(line) and line[column].isspace() else " "
        self.insert(before + mention(path) + after)

    def restore(self, text: str) -> None:
        """Give back text that could not be sent, keeping anything typed since."""
        current = self.text
        self.show_text(text if not current.strip() else f"{text}\n{current}")

    def show_text(self, text: str) -> None:
        """Replace the box's text with ``text``, the cursor at its end (ready to type on)."""
        self.text = text
        self.move_cursor(self.document.end)
