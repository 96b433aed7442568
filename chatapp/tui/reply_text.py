"""The reply widget: the reply rendered as Markdown while it streams, each character tinted by
the source of its token (``markdown_text``); with provenance off, the same Markdown untinted."""

from __future__ import annotations

from collections.abc import Iterable

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from chatapp.chat.events import TokenSource
from chatapp.tui.markdown_inline import InlineStyles
from chatapp.tui.markdown_text import MarkdownRenderer, MarkdownStyles
from chatapp.tui.token_text import TOKEN_CLASSES, join_runs

# The component classes of the Markdown's look (see specchat.tcss).
MARKDOWN_CLASSES = ("reply--h1", "reply--h2", "reply--h3", "reply--code", "reply--link",
                    "reply--bullet", "reply--quote", "reply--rule", "reply--label")
SYNTAX_THEMES = {True: "monokai", False: "default"}  # by whether the app's theme is dark


class ReplyText(Widget):
    """A reply as Markdown with its tokens' provenance (``provenance`` False: without).

    ``append`` renders only what later text may still change (see ``MarkdownRenderer``). Each
    shown character lies in exactly one span whose style carries ``meta={"token": source}``;
    with provenance on, that style is the tint of the source's component style ``token--*``.
    ``runs`` hold the text exactly as given; the rendering shows it made safe (``Printable``).
    """

    DEFAULT_CSS = "ReplyText { height: auto; }"
    COMPONENT_CLASSES = set(TOKEN_CLASSES.values()) | set(MARKDOWN_CLASSES)

    def __init__(self, pieces: Iterable[tuple[str, TokenSource]] = (), *,
                 provenance: bool = True, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.runs: list[tuple[str, TokenSource]] = []
        self.provenance = provenance
        self._renderer: MarkdownRenderer | None = None  # built when first shown (styles: CSS)
        join_runs(self.runs, pieces)

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._restyle)

    def _restyle(self, _theme: object = None) -> None:
        """Render everything again on the next refresh, in the styles of now."""
        self._renderer = None
        self.refresh(layout=True)

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.runs)

    @property
    def text(self) -> Text:
        """The reply as shown."""
        return self.render()

    def set_provenance(self, on: bool) -> None:
        """Show the tints (True) or the Markdown alone (False)."""
        if on != self.provenance:
            self.provenance = on
            self._restyle()

    def append(self, pieces: Iterable[tuple[str, TokenSource]]) -> None:
        added = join_runs(self.runs, pieces)
        if added and self._renderer is not None:
            self._renderer.append(added)
        self.refresh(layout=True)

    def render(self) -> Text:
        if self._renderer is None:
            self._renderer = MarkdownRenderer(self.markdown_styles())
            self._renderer.append(self.runs)
        return self._renderer.text

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
