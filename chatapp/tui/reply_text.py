"""The reply widget: the reply rendered as Markdown while it streams, each character tinted by
the source of its token (``markdown_text``); with provenance off, the same Markdown untinted."""

from __future__ import annotations

from collections.abc import Iterable

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
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
    """A piece of the shown reply: some completed blocks, or a part of the blocks still open."""

    DEFAULT_CSS = "ReplyPart { height: auto; }"

    def __init__(self, text: Text | None = None) -> None:
        super().__init__()
        self.text = text if text is not None else Text(end="")

    def show(self, text: Text) -> None:
        """Show ``text`` instead (see ``repaint``)."""
        self.text = text
        repaint(self)

    def render(self) -> Text:
        text = self.text  # its last line break is the break before the next part
        return text[:-1] if text.plain.endswith("\n") else text


class ReplyText(Widget):
    """A reply as Markdown with its tokens' provenance (``provenance`` False: without).

    ``append`` renders only what later text may still change (see ``MarkdownRenderer``), and only
    that is shown again: completed blocks go into parts of about ``PART_SIZE`` characters that
    are laid out and painted once; the open blocks have two parts of their own, their last line
    (painted again at every append) and the lines before it (painted again only when they
    changed, which a new line does; hidden while there are none). Each shown character lies in
    exactly one span whose style carries ``meta={"token": source}``; with provenance on, that
    style is the tint of the source's component style ``token--*``. ``runs`` hold the text
    exactly as given; the rendering shows it made safe (``Printable``). Work per append does not
    grow with the reply: the pieces are kept as they come, joined into runs when asked.
    """

    DEFAULT_CSS = "ReplyText { height: auto; layout: vertical; }"
    COMPONENT_CLASSES = set(TOKEN_CLASSES.values()) | set(MARKDOWN_CLASSES)
    PART_SIZE = 2000

    def __init__(self, pieces: Iterable[tuple[str, TokenSource]] = (), *,
                 provenance: bool = True, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self._pieces: list[tuple[str, TokenSource]] = []  # as given, empty ones left out
        self.provenance = provenance
        self._renderer: MarkdownRenderer | None = None  # built once mounted (styles: CSS)
        self._parts: list[ReplyPart] = []  # the completed blocks
        self._open_lines = ReplyPart()  # the open blocks' lines before their last
        self._open_lines.display = False
        self._last_line = ReplyPart()
        self._add(pieces)

    def compose(self) -> ComposeResult:
        yield self._open_lines
        yield self._last_line

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._restyle)
        self._restyle()

    def _add(self, pieces: Iterable[tuple[str, TokenSource]]) -> list[tuple[str, TokenSource]]:
        added = [(text, source) for text, source in pieces if text]
        self._pieces += added
        return added

    def _restyle(self, _theme: object = None) -> None:
        """Render everything again, in the styles of now."""
        for part in self._parts:
            part.remove()
        self._parts = []
        self._renderer = MarkdownRenderer(self.markdown_styles())
        self._show(self._renderer.append(self.runs))

    def _show(self, completed: list[Text]) -> None:
        """Add the ``completed`` blocks to the parts and show the open blocks."""
        for block in completed:
            if not self._parts or len(self._parts[-1].text) >= self.PART_SIZE:
                self._parts.append(ReplyPart())
                self.mount(self._parts[-1], before=self._open_lines)
            last = self._parts[-1]
            last.text.append_text(block)
            last.refresh(layout=True)
        self._show_open(self._renderer.open_text)

    def _show_open(self, text: Text) -> None:
        """Show the open blocks ``text``: its last shown line in its part, the lines before it
        in theirs when they changed."""
        plain = text.plain
        cut = plain.rfind("\n", 0, len(plain) - 1) + 1  # where the last shown line starts
        lines = text[:cut]
        shown = self._open_lines.text
        if lines.plain != shown.plain or lines.spans != shown.spans:
            self._open_lines.display = bool(cut)
            self._open_lines.show(lines)
        self._last_line.show(text[cut:])

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
        """The parts shown, in order: the completed blocks', then the open blocks' (the lines
        before their last, then their last)."""
        return [*self._parts, self._open_lines, self._last_line]

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

    def append(self, pieces: Iterable[tuple[str, TokenSource]]) -> None:
        added = self._add(pieces)
        if added and self._renderer is not None:
            self._show(self._renderer.append(added))

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
