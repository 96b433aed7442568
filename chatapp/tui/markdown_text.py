"""A reply's Markdown as one Rich ``Text`` in which every shown character keeps the provenance
of the token it came from (no widgets: the reply widget and the tests use it).

The runs ``(text, source)`` are first made safe to show (``Printable``: controls as visible
symbols, CR LF as one line break), then read as Markdown blocks (``markdown_blocks``) and inline
Markdown (``markdown_inline``). Markdown and syntax colours take the foreground; the provenance is
the style ``styles.tints[source]`` on exactly the characters of that source's tokens (with
provenance off, a style that carries only the ``{"token": source}`` meta). A shown character is
either copied from the text, one for one, or drawn for a marker it replaces (``•`` for ``-``,
``▌`` for ``>``, the rule's line): drawn characters take the provenance of their marker. A tool
call (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) is shown folded, as one line
``▸ tool call NAME ARGUMENTS`` drawn for its opening tag.

Incremental: ``append`` renders each completed block once and keeps it; only the blocks that
later text may still change (the last, or the last two: see ``open_from``) are rendered again,
and only their text is kept to be read again (``source``).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from rich.style import Style
from rich.syntax import PygmentsSyntaxTheme
from rich.text import Span, Text

from chatapp.chat.events import TokenSource
from chatapp.chat.terminal_text import Printable
from chatapp.tui.markdown_blocks import (
    HEADING,
    ITEM,
    TOOL_CLOSE,
    TOOL_OPEN,
    Block,
    closes_fence,
    fence_language,
    fence_of,
    open_from,
    split_blocks,
)
from chatapp.tui.markdown_inline import InlineStyles, inline_ranges

RULE_WIDTH = 40


@dataclass(frozen=True)
class MarkdownStyles:
    """How the Markdown looks. ``headings``: by level from 1 (the last for deeper levels);
    ``label``: a code block's language; ``syntax_theme``: a Pygments style name; ``tints``: the
    provenance style of each source."""

    headings: tuple[Style, ...]
    inline: InlineStyles
    bullet: Style
    quote: Style
    rule: Style
    label: Style
    syntax_theme: str
    tints: Mapping[TokenSource, Style]


class Piece(NamedTuple):
    """Shown text: copied from the source at ``at`` one for one, or (``drawn``) standing for
    the marker at ``at``; ``at`` None: no provenance."""

    text: str
    at: int | None
    style: Style | None = None
    drawn: bool = False


class Provenance:
    """The source of each character of the shown source, as runs."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.sources: list[TokenSource] = []

    def add(self, length: int, source: TokenSource) -> None:
        if not length:
            return
        end = (self.ends[-1] if self.ends else 0) + length
        if self.sources and self.sources[-1] == source:
            self.ends[-1] = end
        else:
            self.ends.append(end)
            self.sources.append(source)

    def runs(self, start: int, end: int) -> Iterable[tuple[int, int, TokenSource]]:
        """(start, end, source) of each run that ``start:end`` covers, clipped to it."""
        index = bisect.bisect_right(self.ends, start)
        while start < end and index < len(self.ends):
            stop = min(end, self.ends[index])
            yield start, stop, self.sources[index]
            start, index = stop, index + 1


class MarkdownRenderer:
    """A reply's runs rendered as Markdown with provenance, built as the reply streams."""

    def __init__(self, styles: MarkdownStyles) -> None:
        self.styles = styles
        self.source = ""  # the open blocks' text, as it may be shown (see ``Printable``)
        self._offset = 0  # where ``source`` starts in the whole reply's shown text
        self.provenance = Provenance()
        self.closed = Text(end="")  # the blocks that no later text changes
        self._printable = Printable()
        self._open = Text(end="")
        self._text: Text | None = None
        self._lexers: dict[str, Lexer | None] = {}
        self._syntax = PygmentsSyntaxTheme(styles.syntax_theme)
        self._token_styles: dict[_TokenType, Style] = {}

    def append(self, runs: Iterable[tuple[str, TokenSource]]) -> list[Text]:
        """Add the runs' text and render what changed; returns the blocks completed by it (now
        at the end of ``closed``)."""
        for text, source in runs:
            shown = self._printable(text)
            self.source += shown
            self.provenance.add(len(shown), source)
        blocks = split_blocks(self.source)
        keep = open_from(blocks, self.source)
        self._open = Text(end="")
        completed = []
        for block in blocks:
            rendered = self.render_block(block)
            if block.end <= keep:
                self.closed.append_text(rendered)
                completed.append(rendered)
            else:
                self._open.append_text(rendered)
        self.source = self.source[keep:]
        self._offset += keep
        self._text = None
        return completed

    @property
    def open_text(self) -> Text:
        """The rendering of the blocks that later text may still change."""
        return self._open

    @property
    def text(self) -> Text:
        """Everything rendered so far."""
        if self._text is None:
            text = self.closed.copy()
            text.append_text(self._open)
            self._text = text
        return self._text

    def render_block(self, block: Block) -> Text:
        """One block as shown, with its Markdown styles and provenance."""
        render = getattr(self, f"_{block.kind}")
        return self._assemble(render(block))

    def _assemble(self, pieces: Iterable[Piece]) -> Text:
        parts: list[str] = []
        spans: list[Span] = []
        tints: list[Span] = []
        tint_sources: list[TokenSource] = []
        position = 0
        for piece in pieces:
            length = len(piece.text)
            if not length:
                continue
            parts.append(piece.text)
            if piece.style is not None:
                spans.append(Span(position, position + length, piece.style))
            if piece.at is not None:
                at = self._offset + piece.at
                runs = self.provenance.runs(at, at + (1 if piece.drawn else length))
                for start, end, source in runs:
                    if piece.drawn:
                        start, end = at, at + length
                    self._tint(tints, tint_sources, position + start - at,
                               position + end - at, source)
            position += length
        return Text("".join(parts), spans=spans + tints, end="")

    def _tint(self, tints: list[Span], sources: list[TokenSource], start: int, end: int,
              source: TokenSource) -> None:
        """Add a tint span, joined to the previous one when it is the same source's and they
        meet (one span per run, however the text came)."""
        if tints and sources[-1] == source and tints[-1].end == start:
            tints[-1] = Span(tints[-1].start, end, tints[-1].style)
            return
        tints.append(Span(start, end, self.styles.tints[source]))
        sources.append(source)

    # -- blocks ---------------------------------------------------------------------------------

    def _inline(self, start: int, end: int, style: Style | None = None) -> list[Piece]:
        source = self.source
        return [Piece(source[a:b], a, s)
                for a, b, s in inline_ranges(source, start, end, self.styles.inline, style)]

    def _blank(self, block: Block) -> list[Piece]:
        return [Piece(self.source[block.start:block.end], block.start)]

    def _paragraph(self, block: Block) -> list[Piece]:
        return self._inline(block.start, block.end)

    def _heading(self, block: Block) -> list[Piece]:
        line = self.source[block.start:block.end]
        body = line.rstrip("\n")
        marker = HEADING.match(body)
        level = len(marker.group(1))
        content = body[marker.end():].rstrip()
        stripped = content.rstrip("#")
        if not stripped or stripped[-1] in " \t":  # a closing run of #s is left out
            content = stripped.rstrip()
        styles = self.styles.headings
        style = styles[min(level, len(styles)) - 1]
        start = block.start + marker.end()
        pieces = self._inline(start, start + len(content), style)
        return pieces + [Piece("\n", block.start + len(body))] * line.endswith("\n")

    def _rule(self, block: Block) -> list[Piece]:
        line = self.source[block.start:block.end]
        first = block.start + len(line) - len(line.lstrip())
        newline = [Piece("\n", block.end - 1)] * line.endswith("\n")
        return [Piece("─" * RULE_WIDTH, first, self.styles.rule, drawn=True), *newline]

    def _item(self, block: Block) -> list[Piece]:
        source = self.source
        line_end = source.find("\n", block.start, block.end)
        marker = ITEM.match(source[block.start:block.end if line_end < 0 else line_end])
        at, after = block.start + marker.start(2), block.start + marker.end(2)
        bullet = source[at:after]
        shown = "•" if bullet in "-*+" else bullet
        return [Piece(source[block.start:at], block.start), Piece(shown, at, self.styles.bullet),
                *self._inline(after, block.end)]

    def _quote(self, block: Block) -> list[Piece]:
        source, style = self.source, self.styles.quote
        pieces: list[Piece] = []
        start = block.start
        while start < block.end:
            end = source.find("\n", start, block.end) + 1 or block.end
            index = start
            while index < end and source[index] in "> " and (
                    source[index] == ">" or not source[start:index].strip(" >")):
                if source[index] == ">":
                    pieces.append(Piece("▌", index, style))
                else:
                    pieces.append(Piece(" ", index))
                index += 1
            pieces += self._inline(index, end, style)
            start = end
        return pieces

    def _tool(self, block: Block) -> list[Piece]:
        source = self.source
        body = source[block.start:block.end].strip()
        body = body.removeprefix(TOOL_OPEN).removesuffix(TOOL_CLOSE).strip()
        newline = [Piece("\n", block.end - 1)] * source[block.start:block.end].endswith("\n")
        label = Piece("▸ tool call", block.start, self.styles.label, drawn=True)
        return [label, Piece(f" {_call_summary(body)}", block.start, drawn=True), *newline]

    def _code(self, block: Block) -> list[Piece]:
        source = self.source
        first_end = source.find("\n", block.start, block.end) + 1 or block.end
        opening = source[block.start:first_end].rstrip("\n")
        fence = fence_of(opening) or "```"
        pieces: list[Piece] = []
        language_start, language_end = fence_language(opening)
        language = opening[language_start:language_end]
        # the whole info string: what follows the language (code, a file's path) shows too
        label = opening[language_start:].rstrip()
        if label:
            pieces.append(Piece(label, block.start + language_start, self.styles.label))
            if source[first_end - 1] == "\n":
                pieces.append(Piece("\n", first_end - 1))
        body_end = block.end
        if not block.open:
            body_end = source.rfind("\n", first_end, block.end - 1) + 1 or first_end
        else:
            last = source.rfind("\n", first_end, block.end) + 1 or first_end
            tail = source[last:block.end]
            if tail.strip() and closes_fence(tail, fence[0] * len(tail.strip())):
                body_end = last  # a closing fence on its way: not shown as code
        return pieces + self._highlight(language, first_end, max(first_end, body_end))

    def _highlight(self, language: str, start: int, end: int) -> list[Piece]:
        """The code at ``start:end`` in the syntax colours of ``language`` (plain when no lexer
        knows it)."""
        code = self.source[start:end]
        lexer = self._lexer(language)
        if lexer is None:
            return [Piece(code, start, self.styles.inline.code)]
        pieces = []
        covered = 0
        for index, token, value in lexer.get_tokens_unprocessed(code):
            if index != covered or code[index:index + len(value)] != value:
                return [Piece(code, start)]  # a lexer that rewrites the text: no colours
            covered += len(value)
            pieces.append(Piece(value, start + index, self._token_style(token)))
        return pieces if covered == len(code) else [Piece(code, start)]

    def _token_style(self, token: _TokenType) -> Style | None:
        """A syntax colour without its background (the background shows the provenance)."""
        style = self._token_styles.get(token)
        if style is None:
            themed = self._syntax.get_style_for_token(token)
            style = self._token_styles[token] = Style(
                color=themed.color, bold=themed.bold, italic=themed.italic,
                underline=themed.underline)
        return style or None

    def _lexer(self, language: str) -> Lexer | None:
        if language not in self._lexers:
            try:
                lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False) \
                    if language else None
            except ClassNotFound:
                lexer = None
            self._lexers[language] = lexer
        return self._lexers[language]


def _call_summary(body: str) -> str:
    """A tool call's name and its arguments on one line; "…" while they do not parse yet."""
    try:
        call = json.loads(body)
    except ValueError:
        return "…"
    if not isinstance(call, dict):
        return "…"
    arguments = call.get("arguments", {})
    shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{call.get('name', '?')} {shown}"


def render_markdown(runs: Iterable[tuple[str, TokenSource]], styles: MarkdownStyles) -> Text:
    """The runs rendered at once (see ``MarkdownRenderer``)."""
    renderer = MarkdownRenderer(styles)
    renderer.append(runs)
    return renderer.text
