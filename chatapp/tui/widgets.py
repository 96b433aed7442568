"""Widgets of the chat screen. They show what the app hands them; none of them calls a model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.style import Style
from rich.text import Span, Text
from textual import events
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Label, Markdown, Static

from chatapp.chat.attachments import Attachment
from chatapp.chat.events import TokenSource, TurnStats
from chatapp.chat.terminal_text import Printable, printable, printable_line
from chatapp.chat.turns import ChatEntry, Turn
from chatapp.tui.stats_view import STYLE_NAMES, TurnInfo, render_stats

TOKEN_CLASSES = {source: f"token--{source.value}" for source in TokenSource}

TOKEN_MEANINGS = {
    TokenSource.ACCEPTED: "drafted by the small model and accepted by the target",
    TokenSource.RESAMPLED: "the target's own token where it rejected the draft",
    TokenSource.BONUS: "a free extra token after the target accepted every draft",
    TokenSource.TARGET: "decoded by the target alone (K = 0)",
}


class TokenText(Widget):
    """Text coloured by token source. ``append`` adds to one Rich ``Text``: no full re-render.

    Each span's style is the component style of its source plus ``meta={"token": source}``.
    Pieces with source None are plain text (for legends).
    """

    DEFAULT_CSS = "TokenText { height: auto; }"
    COMPONENT_CLASSES = set(TOKEN_CLASSES.values())

    def __init__(self, pieces: Iterable[tuple[str, TokenSource | None]] = (), *,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.runs: list[tuple[str, TokenSource | None]] = []  # exactly as given
        self.text = Text()  # as shown: see ``printable``
        self._shown = Printable()
        self._stale = True  # styles are read from CSS on the first render (and on theme change)
        self._styles: dict[TokenSource, Style] = {}
        self._add_runs(pieces)

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._restyle)

    def _restyle(self, _theme: object = None) -> None:
        self._stale = True
        self._styles.clear()
        self.refresh(layout=True)

    def token_style(self, source: TokenSource) -> Style:
        """The style of a source's tokens: one object per source (a Style with meta gets a
        random link id, so equal-looking new ones would not compare equal)."""
        style = self._styles.get(source)
        if style is None:
            style = self.get_component_rich_style(TOKEN_CLASSES[source], partial=True)
            style = self._styles[source] = style + Style(meta={"token": source.value})
        return style

    def append(self, pieces: Iterable[tuple[str, TokenSource | None]]) -> None:
        added = self._add_runs(pieces)
        if not self._stale:
            for text, source in added:
                self._append_text(text, source)
        self.refresh(layout=True)

    def _append_text(self, text: str, source: TokenSource | None) -> None:
        """Append to ``self.text`` as shown, one span per run of a source: the same spans
        whether the text was built at once or token by token."""
        shown = self._shown(text)
        if not shown:
            return
        start = len(self.text)
        self.text.append(shown)
        end = len(self.text)
        if source is None:
            return
        style = self.token_style(source)
        spans = self.text.spans
        if spans and spans[-1].end == start and spans[-1].style is style:
            spans[-1] = Span(spans[-1].start, end, style)
        else:
            spans.append(Span(start, end, style))

    def _add_runs(self, pieces: Iterable[tuple[str, TokenSource | None]]
                  ) -> list[tuple[str, TokenSource | None]]:
        added = [(text, source) for text, source in pieces if text]
        for text, source in added:
            if self.runs and self.runs[-1][1] == source:
                self.runs[-1] = (self.runs[-1][0] + text, source)
            else:
                self.runs.append((text, source))
        return added

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.runs)

    def render(self) -> Text:
        if self._stale:
            self.text = Text()
            self._shown = Printable()
            for text, source in self.runs:
                self._append_text(text, source)
            self._stale = False
        return self.text


class Legend(TokenText):
    """One line that says what the token colours mean."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_colours(True)

    def show_colours(self, on: bool) -> None:
        self.runs, self._stale = [], True
        if on:
            pieces: list[tuple[str, TokenSource | None]] = [("tokens: ", None)]
            for source in TokenSource:
                pieces += [(f"■ {source.value}", source), ("  ", None)]
            pieces.append(("F3 plain text", None))
        else:
            pieces = [("plain text (Markdown) · F3 shows the token colours again", None)]
        self._add_runs(pieces)
        self.refresh(layout=True)


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
        self.tokens: TokenText | None = None
        self.markdown: Markdown | None = None  # mounted on the first switch to plain text
        self._markdown_shown = Printable()
        self._markdown_starting = False
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
            self.tokens = TokenText(self._initial_pieces, classes="message-body")
            self.tokens.display = self.highlight
            yield self.tokens
        else:
            yield Static(Text(printable(self.content)), classes="message-body")

    @property
    def plain(self) -> str:
        if self.tokens is not None:
            return self.tokens.plain
        if self.role == "assistant":
            return "".join(text for text, _ in self._initial_pieces)
        return self.content

    @property
    def live(self) -> bool:
        return self.turn is not None and not self.turn.done

    def append(self, pieces: Sequence[tuple[str, TokenSource]]) -> None:
        if self.tokens is None:
            self._initial_pieces.extend(pieces)
            return
        self.tokens.append(pieces)
        if self.markdown is not None and not self.highlight:
            fragment = self._markdown_shown("".join(text for text, _ in pieces))
            if fragment:
                self.markdown.append(fragment)

    def on_mount(self) -> None:
        if self.role == "assistant" and not self.highlight:
            self.call_later(self._start_markdown)

    async def _start_markdown(self) -> None:
        """Mount the Markdown view, then fill it. Until it is mounted, ``append`` leaves it
        alone (a Markdown widget takes appends only once its first update has run)."""
        if self._markdown_starting:
            return
        self._markdown_starting = True
        markdown = Markdown(classes="message-body")
        markdown.display = not self.highlight
        await self.mount(markdown)
        self.markdown = markdown
        self._markdown_shown = Printable()
        markdown.append(self._markdown_shown(self.plain))

    def set_highlighting(self, on: bool) -> None:
        if self.role != "assistant" or on == self.highlight:
            return
        self.highlight = on
        if self.tokens is not None:
            self.tokens.display = on
        if self.markdown is not None:
            if not on:
                self._markdown_shown = Printable()
                self.markdown.update(self._markdown_shown(self.plain))
            self.markdown.display = not on
        elif not on and self.is_mounted:
            self.call_later(self._start_markdown)

    def update_header(self, stats: TurnStats | None = None) -> None:
        if stats is not None:
            self.stats = stats
        self.header.update(self._header_text())
        self._set_state_classes()

    def finish(self, entry: ChatEntry) -> None:
        """The reply is done: show ``entry``, the conversation's record of it."""
        self.entry = entry
        self.k_label = entry.k_label
        self.finish_reason = entry.finish_reason
        self.turn = None
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
            parts.append("…")
        return " · ".join(parts)

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.Selected(self))


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
        self.body.update(render_stats(stats, info, baseline_tps, styles))

    def show_nothing(self) -> None:
        self.shown = None
        self.body.update(Text("No reply yet. Statistics of the live or selected turn show "
                              "here.\n\nTab, then up/down: select a message.", style="dim"))
