"""The blocks of a Markdown reply, line by line: fenced code, headings, rules, blank lines, list
items, quotes and paragraphs (a subset of CommonMark that replies use; no setext headings, tables
or indented code: they show as the text they are), and tool calls (a line that starts with
``<tool_call>`` opens one, a complete line that holds ``</tool_call>`` closes it).

``split_blocks`` reads from a block's start and is final for every block but the last: a block
ends where a complete line starts another one, and a complete line's kind depends only on the
line and the blocks before it. So a streaming reply keeps the blocks before its last one and
reads again only from there (see ``MarkdownRenderer``). A paragraph (or a list item) whose first
line holds no inline marker ends with that line (the next line starts a paragraph that renders
the same), so that a long text without blank lines is not one block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*")
HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+|$)")
RULE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*")
ITEM = re.compile(r"([ \t]*)([-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
QUOTE = re.compile(r" {0,3}>")
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
# What inline Markdown starts with: lines before the first of them render the same on their own.
INLINE_MARKERS = frozenset("*_~`[\\")


@dataclass(frozen=True)
class Block:
    """Source ``start:end`` (its line breaks included) of one block; ``kind``: "code", "tool",
    "heading", "rule", "blank", "item", "quote" or "paragraph"; ``open``: a code block without
    its closing fence yet, or a tool call without its closing tag (the text may end inside)."""

    kind: str
    start: int
    end: int
    open: bool = False


def line_kind(line: str) -> str:
    """The kind of block a line starts (``paragraph`` for plain text)."""
    if not line.strip():
        return "blank"
    if fence_of(line):
        return "code"
    if line.lstrip().startswith(TOOL_OPEN):
        return "tool"
    if HEADING.match(line):
        return "heading"
    if RULE.fullmatch(line):
        return "rule"
    if ITEM.match(line):
        return "item"
    if QUOTE.match(line):
        return "quote"
    return "paragraph"


def fence_of(line: str) -> str | None:
    """The fence (```` ``` ```` or ``~~~``, as long as written) that ``line`` opens a code
    block with, or None (a backtick fence's info string has no backtick)."""
    match = FENCE.fullmatch(line)
    if match is None or (match.group(1)[0] == "`" and "`" in line[match.end(1):]):
        return None
    return match.group(1)


def fence_language(line: str) -> tuple[int, int]:
    """Where the language of an opening fence line is, as (start, end) in the line."""
    match = FENCE.fullmatch(line)
    return (match.start(2), match.end(2)) if match else (0, 0)


def closes_fence(line: str, fence: str) -> bool:
    """Whether ``line`` closes a code block opened by ``fence`` (the same character, at least as
    many, nothing after)."""
    stripped = line.strip()
    return (len(line) - len(line.lstrip(" ")) <= 3 and len(stripped) >= len(fence)
            and stripped == fence[0] * len(stripped))


def _lines(source: str, start: int) -> list[tuple[int, int, bool]]:
    """(start, end with its line break, complete) of each line from ``start``."""
    lines = []
    pos = start
    while pos < len(source):
        newline = source.find("\n", pos)
        end = len(source) if newline < 0 else newline + 1
        lines.append((pos, end, newline >= 0))
        pos = end
    return lines


def split_blocks(source: str, start: int = 0) -> list[Block]:
    """The blocks of ``source`` from ``start`` (a block's start) to its end."""
    lines = _lines(source, start)
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        line_start, line_end, _ = lines[index]
        line = source[line_start:line_end].rstrip("\n")
        kind = line_kind(line)
        last = index
        if kind == "code":
            last = _fence_end(source, lines, index, fence_of(line) or "```")
            closed = last < len(lines)
            last = min(last, len(lines) - 1)
            blocks.append(Block(kind, line_start, lines[last][1], open=not closed))
            index = last + 1
            continue
        if kind == "tool":
            last = _tool_end(source, lines, index)
            closed = last < len(lines)
            last = min(last, len(lines) - 1)
            blocks.append(Block(kind, line_start, lines[last][1], open=not closed))
            index = last + 1
            continue
        if kind in ("paragraph", "item", "quote"):
            content = line_start + (ITEM.match(line).end() if kind == "item" else 0)
            plain = kind != "quote" and INLINE_MARKERS.isdisjoint(source[content:line_end])
            while last + 1 < len(lines) and not plain and _continues(
                    source, lines[last + 1], kind):
                last += 1
        blocks.append(Block(kind, line_start, lines[last][1]))
        index = last + 1
    return blocks


def _fence_end(source: str, lines: list[tuple[int, int, bool]], index: int, fence: str) -> int:
    """The index of the line that closes the code block opened on line ``index``, or
    ``len(lines)`` when none does yet (a closing line counts once it is complete)."""
    for later in range(index + 1, len(lines)):
        start, end, complete = lines[later]
        if complete and closes_fence(source[start:end - 1], fence):
            return later
    return len(lines)


def _tool_end(source: str, lines: list[tuple[int, int, bool]], index: int) -> int:
    """The index of the complete line that closes the tool call opened on line ``index`` (it
    may be that line), or ``len(lines)`` when none does yet."""
    for later in range(index, len(lines)):
        start, end, complete = lines[later]
        if complete and TOOL_CLOSE in source[start:end]:
            return later
    return len(lines)


def _continues(source: str, line: tuple[int, int, bool], kind: str) -> bool:
    """Whether ``line`` carries on a block of ``kind`` (a lazy continuation line, or another
    quote line of a quote)."""
    text = source[line[0]:line[1]].rstrip("\n")
    following = line_kind(text)
    return following == "paragraph" or (kind == "quote" and following == "quote")


def open_from(blocks: list[Block], source: str) -> int:
    """Where the part of ``source`` that later text may still change begins: the last block's
    start, or the one before it when the last starts on an incomplete line (whose kind may still
    change: ``#`` may become ``#x``, which carries on a paragraph)."""
    if not blocks:
        return len(source)
    last = blocks[-1]
    if len(blocks) > 1 and "\n" not in source[last.start:]:
        return blocks[-2].start
    return last.start
