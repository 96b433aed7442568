"""Inline Markdown of one block: ``**bold**``, ``*italic*`` (and the ``_`` forms),
``~~struck~~``, `` `code` ``, ``[links](url)`` and backslash escapes.

``inline_ranges`` does not copy text: it says which ranges of the source are shown, in order, and
in which style; the markers (``**``, the backticks, a link's brackets and address, an escape's
backslash) are left out. A marker without its closing partner is shown as it is, so a streaming
reply shows ``**`` literally until the closing ``**`` arrives.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rich.style import Style

ESCAPABLE = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
LINK = re.compile(r"\[([^\]\n]*)\]\(([^()\s]*)\)")
Range = tuple[int, int, Style | None]


@dataclass(frozen=True)
class InlineStyles:
    """The styles of inline Markdown."""

    bold: Style
    italic: Style
    strike: Style
    code: Style
    link: Style


def _join(outer: Style | None, inner: Style) -> Style:
    return inner if outer is None else outer + inner


def _run_length(source: str, index: int, end: int) -> int:
    char, length = source[index], 1
    while index + length < end and source[index + length] == char:
        length += 1
    return length


def _closing_backticks(source: str, start: int, end: int, length: int) -> int | None:
    """Where a run of exactly ``length`` backticks begins in ``start:end``, or None."""
    index = start
    while index < end:
        index = source.find("`", index, end)
        if index < 0:
            return None
        run = _run_length(source, index, end)
        if run == length:
            return index
        index += run
    return None


def _can_open(source: str, index: int, marker: str, end: int) -> bool:
    after = index + len(marker)
    if after >= end or source[after].isspace():
        return False
    return marker[0] != "_" or index == 0 or not source[index - 1].isalnum()


def _closing(source: str, start: int, end: int, marker: str) -> int | None:
    """Where the marker that closes one opened just before ``start`` begins, or None: after
    some text that does not end in a space, not inside a word for ``_``, the last of a longer
    run (``***`` closes ``*`` and ``**``)."""
    index = source.find(marker, start + 1, end)
    while index >= 0:
        run_end = index + _run_length(source, index, end)
        candidate = run_end - len(marker)
        char = marker[0]
        good = not source[candidate - 1].isspace() and (
            char != "_" or run_end >= end or not source[run_end].isalnum())
        if good and (char == "~" or len(marker) == 2 or run_end - index != 2):
            return candidate
        index = source.find(marker, run_end, end)
    return None


def inline_ranges(source: str, start: int, end: int, styles: InlineStyles,
                  style: Style | None = None) -> list[Range]:
    """The shown ranges of ``source[start:end]`` with their styles (``style`` underneath)."""
    ranges: list[Range] = []
    _parse(source, start, end, styles, style, ranges.append)
    return ranges


def _parse(source: str, start: int, end: int, styles: InlineStyles, style: Style | None,
           emit: Callable[[Range], None]) -> None:
    index = text_start = start

    def flush(upto: int) -> None:
        if upto > text_start:
            emit((text_start, upto, style))

    while index < end:
        char = source[index]
        if char == "\\" and index + 1 < end and source[index + 1] in ESCAPABLE:
            flush(index)
            text_start, index = index + 1, index + 2
            continue
        if char == "`":
            run = _run_length(source, index, end)
            close = _closing_backticks(source, index + run, end, run)
            if close is not None:
                flush(index)
                emit((index + run, close, _join(style, styles.code)))
                text_start = index = close + run
                continue
            index += run
            continue
        if char in "*_~":
            run = _run_length(source, index, end)
            marker = char * (2 if run >= 2 else 1)
            inner = {"*": styles.italic, "_": styles.italic}.get(char) if len(marker) == 1 else (
                styles.strike if char == "~" else styles.bold)
            if inner is not None and _can_open(source, index, marker, end):
                close = _closing(source, index + len(marker), end, marker)
                if close is not None and close > index + len(marker):
                    flush(index)
                    _parse(source, index + len(marker), close, styles, _join(style, inner), emit)
                    text_start = index = close + len(marker)
                    continue
            index += run
            continue
        if char == "[":
            link = LINK.match(source, index, end)
            if link is not None and link.group(1):
                flush(index)
                _parse(source, link.start(1), link.end(1), styles,
                       _join(style, styles.link + Style(link=link.group(2) or None)), emit)
                text_start = index = link.end()
                continue
        index += 1
    flush(end)
