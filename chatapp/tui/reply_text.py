"""The reply widget: the reply rendered as Markdown while it streams, each character tinted by
the source of its token (``markdown_text``); with provenance off, the same Markdown untinted."""

from __future__ import annotations

from collections.abc import Iterable

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.geometry import Region
from textual.visual import visualize
from textual.widget import Widget

from chatapp.chat.events import TokenSource
from chatapp.tui.markdown_inline import InlineStyles
from chatapp.tui.markdown_text import MarkdownRenderer, MarkdownStyles
from chatapp.tui.repaint import repaint
from chatapp.tui.token_text import TOKEN_CLASSES, join_runs

# The component classes of the Markdown's look (see specchat.tcss).
MARKDOWN_CLASSES = ("reply--h1", "reply--h2", "reply--h3", "reply--code", "reply--link",
                    "reply--bullet", "reply--quote", "reply--rule", "reply--label")
SYNTAX_THEMES = {True: "monokai", False: "default"}  # by whether the app's theme is dark


class ReplyPart(Widget):
    """A piece of the shown reply: some completed blocks, or the reply's live end."""

    DEFAULT_CSS = "ReplyPart { height: auto; }"

    def __init__(self, text: Text | None = None) -> None:
        super().__init__()
        self.text = text if text is not None else Text(end="")
        self._reserved = 0  # lines held for the text while a reply streams (0: auto height)
        self._head, self._head_lines = Text(end=""), 0  # the text before the last line, its lines

    def show(self, text: Text) -> None:
        """Show ``text`` instead (see ``repaint``), at the height it takes."""
        self.text = text
        if self._reserved:
            self._reserved, self._head, self._head_lines = 0, Text(end=""), 0
            self.styles.height = "auto"
        repaint(self)

    def show_reserving(self, text: Text, step: int) -> None:
        """Show ``text`` in a height held ``step`` lines ahead of it: the screen is laid out
        again only when the text outgrows the lines held (every ``step`` new lines), else the
        part is painted again alone, from its last line on when the lines before it did not
        change. ``show`` gives the part back its own height."""
        self.text = text
        width = self.content_size.width
        if not width:  # not laid out yet
            self.refresh(layout=True)
            return
        plain = text.plain
        cut = plain.rfind("\n", 0, len(plain) - 1) + 1  # where the last shown line starts
        head = text[:cut]
        changed_from = self._head_lines
        if head.plain != self._head.plain or head.spans != self._head.spans:
            self._head, self._head_lines, changed_from = head, self._lines(head, width), 0
        lines = self._head_lines + self._lines(text[cut:], width)
        if not self._reserved or lines > self._reserved:
            self._reserved = lines + step - 1
            self.styles.height = self._reserved  # a layout
            self.refresh()
        else:
            self.refresh(Region(0, changed_from, width, self._reserved - changed_from))

    def _lines(self, text: Text, width: int) -> int:
        """The lines ``text`` takes in this part at ``width`` columns."""
        if not text:
            return 0
        return visualize(self, _shown(text)).get_height(self.styles, width)

    def render(self) -> Text:
        return _shown(self.text)


def _shown(text: Text) -> Text:
    """``text`` as a part shows it: its last line break is the break before the next part."""
    return text[:-1] if text.plain.endswith("\n") else text


class ReplyText(Widget):
    """A reply as Markdown with its tokens' provenance (``provenance`` False: without).

    ``append`` renders only what later text may still change (see ``MarkdownRenderer``), and only
    that is shown again. The reply's live end is one part: the blocks completed since the last
    flush, then the open blocks; it is painted again at every append. While the reply streams
    (from the first ``append`` to ``settle``) that part holds ``RESERVE_LINES`` lines ahead of its
    text, so that a new line costs a paint of that part, not a layout of the whole screen; once
    the completed blocks in it pass ``LIVE_LINES`` lines they move into parts of about
    ``PART_SIZE`` characters that are laid out and painted once. Each shown character lies in
    exactly one span whose style carries ``meta={"token": source}``; with provenance on, that
    style is the tint of the source's component style ``token--*``. ``runs`` hold the text
    exactly as given; the rendering shows it made safe (``Printable``). Work per append does not
    grow with the reply: the pieces are kept as they come, joined into runs when asked.
    """

    DEFAULT_CSS = "ReplyText { height: auto; layout: vertical; }"
    COMPONENT_CLASSES = set(TOKEN_CLASSES.values()) | set(MARKDOWN_CLASSES)
    PART_SIZE = 2000
    LIVE_LINES = 24
    RESERVE_LINES = 4

    def __init__(self, pieces: Iterable[tuple[str, TokenSource]] = (), *,
                 provenance: bool = True, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self._pieces: list[tuple[str, TokenSource]] = []  # as given, empty ones left out
        self.provenance = provenance
        self._renderer: MarkdownRenderer | None = None  # built once mounted (styles: CSS)
        self._parts: list[ReplyPart] = []  # the completed blocks moved out of the live part
        self._completed = Text(end="")  # the completed blocks still in the live part
        self._live = ReplyPart()
        self._streaming = False
        self._add(pieces)

    def compose(self) -> ComposeResult:
        yield self._live

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._restyle)
        self._restyle()

    def _add(self, pieces: Iterable[tuple[str, TokenSource]]) -> list[tuple[str, TokenSource]]:
        added = [(text, source) for text, source in pieces if text]
        self._pieces += added
        return added

    def append(self, pieces: Iterable[tuple[str, TokenSource]]) -> None:
        """More of a streaming reply (``settle`` when it ends)."""
        self._streaming = True
        added = self._add(pieces)
        if added and self._renderer is not None:
            self._show(self._renderer.append(added))

    def settle(self) -> None:
        """The reply ended: its live part takes the height of its text again."""
        self._streaming = False
        if self._renderer is not None:
            self._show([])

    def _restyle(self, _theme: object = None) -> None:
        """Render everything again, in the styles of now."""
        for part in self._parts:
            part.remove()
        self._parts, self._completed = [], Text(end="")
        self._renderer = MarkdownRenderer(self.markdown_styles())
        self._show(self._renderer.append(self.runs))

    def _show(self, completed: list[Text]) -> None:
        """Add the ``completed`` blocks to the live part (moving them on into parts once they
        are many) and show it with the open blocks."""
        for block in completed:
            self._completed.append_text(block)
        if not self._streaming or self._completed.plain.count("\n") >= self.LIVE_LINES:
            self._flush()
        live = Text(end="")
        live.append_text(self._completed)
        live.append_text(self._renderer.open_text)
        if self._streaming:
            self._live.show_reserving(live, self.RESERVE_LINES)
        else:
            self._live.show(live)

    def _flush(self) -> None:
        """Move the live part's completed blocks into the parts, ``PART_SIZE`` at a time."""
        if not self._completed:
            return
        if not self._parts or len(self._parts[-1].text) >= self.PART_SIZE:
            self._parts.append(ReplyPart())
            self.mount(self._parts[-1], before=self._live)
        last = self._parts[-1]
        last.text.append_text(self._completed)
        last.refresh(layout=True)
        self._completed = Text(end="")

    @property
    def runs(self) -> list[tuple[str, TokenSource]]:
        """The text as given, one run per source (see ``join_runs``)."""
        runs: list[tuple[str, TokenSource]] = []
        join_runs(runs, self._pieces)
        return runs

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self._pieces)

    @property
    def parts(self) -> list[ReplyPart]:
        """The parts shown, in order: the completed blocks', then the live one."""
        return [*self._parts, self._live]

    @property
    def text(self) -> Text:
        """The reply as shown (all its parts in one)."""
        if self._renderer is None:
            return Text(end="")
        return self._renderer.text

    def set_provenance(self, on: bool) -> None:
        """Show the tints (True) or the Markdown alone (False)."""
        if on != self.provenance:
            self.provenance = on
            if self._renderer is not None:
                self._restyle()

    def token_style(self, source: TokenSource) -> Style:
        """The style on a source's characters: its tint (provenance on) and its meta."""
        meta = Style(meta={"token": source.value})
        if not self.provenance:
            return meta
        tint = self.get_component_rich_style(TOKEN_CLASSES[source], partial=True).bgcolor
        return Style(bgcolor=tint) + meta

    def markdown_styles(self) -> MarkdownStyles:
        """The look of the Markdown, from the component styles and the app's theme."""
        def style(name: str) -> Style:
            return self.get_component_rich_style(f"reply--{name}", partial=True)

        inline = InlineStyles(bold=Style(bold=True), italic=Style(italic=True),
                              strike=Style(strike=True), code=style("code"), link=style("link"))
        return MarkdownStyles(
            headings=(style("h1"), style("h2"), style("h3")), inline=inline,
            bullet=style("bullet"), quote=style("quote"), rule=style("rule"),
            label=style("label"), syntax_theme=SYNTAX_THEMES[self.app.current_theme.dark],
            tints={source: self.token_style(source) for source in TokenSource})
