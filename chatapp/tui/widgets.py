"""Widgets of the chat screen. They show what the app hands them; none of them calls a model."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Static

from chatapp.chat.attachments import Attachment
from chatapp.chat.events import TokenSource, TurnStats
from chatapp.chat.terminal_text import printable, printable_line
from chatapp.chat.turns import ChatEntry, Turn
from chatapp.tui.repaint import repaint
from chatapp.tui.reply_text import ReplyText
from chatapp.tui.stats_view import STYLE_NAMES, TurnInfo, render_stats


class MessageView(Vertical):
    """One message of the chat. Assistant messages carry their tokens and statistics. ``entry``:
    the conversation's record of the message (None until a streaming reply is done); ``turn``:
    the reply streaming into it (None once done)."""

    class Selected(Message):
        def __init__(self, view: "MessageView") -> None:
            super().__init__()
            self.view = view

    def __init__(self, role: str, content: str = "", *,
                 pieces: Sequence[tuple[str, TokenSource]] | None = None,
                 stats: TurnStats | None = None, k_label: str = "",
                 finish_reason: str | None = None, entry: ChatEntry | None = None,
                 highlight: bool = True, turn: Turn | None = None,
                 target_rpc: Sequence[str] = (),
                 attachments: Sequence[Attachment] = ()) -> None:
        super().__init__(classes=f"-{role}")
        self.attachments = tuple(attachments)  # a user message's files, shown as chips
        self.role = role
        self.content = content
        self.stats = stats
        self.k_label = k_label
        self.target_rpc = tuple(target_rpc)  # where the target ran: RPC servers, or () here
        self.finish_reason = finish_reason
        self.entry = entry
        self.turn = turn
        self.highlight = highlight
        self._initial_pieces = list(pieces) if pieces is not None else (
            [(content, TokenSource.TARGET)] if role == "assistant" and content else [])
        self.header = Label(self._header_text(), classes="message-header", markup=False)
        self.body: ReplyText | None = None  # an assistant message's text, once composed
        self._set_state_classes()

    @classmethod
    def of(cls, entry: ChatEntry, highlight: bool) -> "MessageView":
        """The view of a message of the conversation."""
        return cls(entry.role, entry.content, pieces=entry.pieces, stats=entry.stats,
                   k_label=entry.k_label, finish_reason=entry.finish_reason, entry=entry,
                   highlight=highlight, target_rpc=entry.target_rpc,
                   attachments=entry.attachments)

    def compose(self):
        yield self.header
        for attachment in self.attachments:
            yield Label(attachment_chip(attachment), classes="attachment-chip", markup=False)
        if self.role == "assistant":
            self.body = ReplyText(self._initial_pieces, provenance=self.highlight,
                                  classes="message-body")
            yield self.body
        else:
            yield Static(Text(printable(self.content)), classes="message-body")

    @property
    def plain(self) -> str:
        if self.body is not None:
            return self.body.plain
        if self.role == "assistant":
            return "".join(text for text, _ in self._initial_pieces)
        return self.content

    @property
    def live(self) -> bool:
        return self.turn is not None and not self.turn.done

    def append(self, pieces: Sequence[tuple[str, TokenSource]]) -> None:
        if self.body is None:
            self._initial_pieces.extend(pieces)
        else:
            self.body.append(pieces)

    def set_highlighting(self, on: bool) -> None:
        """Show the provenance of the reply's tokens as tints (True) or not (False)."""
        self.highlight = on
        if self.body is not None:
            self.body.set_provenance(on)

    def update_header(self, stats: TurnStats | None = None) -> None:
        if stats is not None:
            self.stats = stats
        self.header.update(self._header_text(), layout=False)
        repaint(self.header)
        self._set_state_classes()

    def finish(self, entry: ChatEntry) -> None:
        """The reply is done: show ``entry``, the conversation's record of it."""
        self.entry = entry
        self.k_label = entry.k_label
        self.finish_reason = entry.finish_reason
        self.turn = None
        if self.body is not None:
            self.body.settle()
        self.update_header(entry.stats)

    def _set_state_classes(self) -> None:
        self.set_class(self.finish_reason == "cancelled", "-stopped")
        self.set_class(self.finish_reason == "error", "-failed")
        self.set_class(self.turn is not None and self.finish_reason is None, "-live")

    def _header_text(self) -> str:
        if self.role == "user":
            return "You"
        parts = ["Assistant"]
        if self.k_label:
            parts.append(f"K {self.k_label}")
        if self.stats is not None and self.stats.tokens:
            parts.append(f"{self.stats.tokens} tok")
            if self.stats.tokens_per_s:
                parts.append(f"{self.stats.tokens_per_s:.1f} tok/s")
            if self.stats.drafted:
                parts.append(f"{self.stats.acceptance_rate:.0%} accepted")
        ending = {"cancelled": "■ stopped", "error": "✖ failed", "length": "cut at max tokens"}
        if self.finish_reason in ending:
            parts.append(ending[self.finish_reason])
        elif self.turn is not None and self.finish_reason is None:
            parts.append(reading_text(self.turn.reading) if self.turn.reading else "…")
        return " · ".join(parts)

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.Selected(self))


def reading_text(reading: tuple[int, int]) -> str:
    """A long prompt's progress as the live reply's header shows it."""
    done, total = reading
    return f"reading the prompt {done:,} / {total:,}"


def attachment_chip(attachment: Attachment) -> str:
    """A file sent with a message, on one line: ``📎 path (N lines)``."""
    text = attachment.text
    lines = text.count("\n") + bool(text and not text.endswith("\n"))
    return f"📎 {printable_line(attachment.path)} ({lines} line{'s' * (lines != 1)})"


class Note(Static):
    """A line from the app inside the conversation: context trimmed, an error, a hint."""

    def __init__(self, text: str, kind: str = "info", *, id: str | None = None) -> None:
        super().__init__(Text(printable(text)), classes=f"note -{kind}", id=id)


class StatsPanel(VerticalScroll, can_focus=False):
    """Statistics of the live, the selected or the latest turn (scrolls with the mouse; Tab
    skips it so that it goes between the message box and the messages)."""

    COMPONENT_CLASSES = {f"stats--{name}" for name in STYLE_NAMES}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.body = Static(classes="stats-body")
        self.shown: tuple[TurnStats | None, TurnInfo] | None = None

    def compose(self):
        yield self.body

    def show(self, stats: TurnStats | None, info: TurnInfo, baseline_tps: float | None) -> None:
        self.shown = (stats, info)
        styles = {name: self.get_component_rich_style(f"stats--{name}", partial=True)
                  for name in STYLE_NAMES}
        self.body.update(render_stats(stats, info, baseline_tps, styles), layout=False)
        repaint(self.body)

    def show_nothing(self) -> None:
        self.shown = None
        self.body.update(Text("No reply yet. Statistics of the live or selected turn show "
                              "here.\n\nTab, then up/down: select a message.", style="dim"))
