"""Text coloured by the source of each token: the legend, the help screen's table of the
colours, and (``TokenText``) a reply's tokens without Markdown. The colours are the component
styles ``token--*`` (see specchat.tcss): a background tint per source, the same everywhere."""

from __future__ import annotations

from collections.abc import Iterable

from rich.style import Style
from rich.text import Span, Text
from textual.widget import Widget

from chatapp.chat.events import TokenSource
from chatapp.chat.terminal_text import Printable

TOKEN_CLASSES = {source: f"token--{source.value}" for source in TokenSource}

TOKEN_MEANINGS = {
    TokenSource.ACCEPTED: "drafted by the small model and accepted by the target",
    TokenSource.RESAMPLED: "the target's own token where it rejected the draft",
    TokenSource.BONUS: "a free extra token after the target accepted every draft",
    TokenSource.TARGET: "decoded by the target alone (K = 0)",
}


def join_runs(runs: list, pieces: Iterable[tuple[str, TokenSource | None]]) -> list:
    """Add ``pieces`` to ``runs`` (a piece of the last run's source joins it; empty pieces are
    left out); returns the pieces added."""
    added = [(text, source) for text, source in pieces if text]
    for text, source in added:
        if runs and runs[-1][1] == source:
            runs[-1] = (runs[-1][0] + text, source)
        else:
            runs.append((text, source))
    return added


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
        return join_runs(self.runs, pieces)

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
    """One line that says what the token colours mean: a square of each source's tint."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_colours(True)

    def token_style(self, source: TokenSource) -> Style:
        """The square of a source: its tint as the colour of the ``■``."""
        style = self._styles.get(source)
        if style is None:
            tint = self.get_component_rich_style(TOKEN_CLASSES[source], partial=True).bgcolor
            style = self._styles[source] = Style(color=tint, meta={"token": source.value})
        return style

    def show_colours(self, on: bool) -> None:
        self.runs, self._stale = [], True
        if on:
            pieces: list[tuple[str, TokenSource | None]] = [("tokens: ", None)]
            for source in TokenSource:
                pieces += [("■", source), (f" {source.value}  ", None)]
            pieces.append(("F3 hides them", None))
        else:
            pieces = [("Markdown without token colours · F3 shows token colours", None)]
        self._add_runs(pieces)
        self.refresh(layout=True)
