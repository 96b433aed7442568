"""Tokenizing text within a budget: refused as soon as it is known to pass a number of tokens,
stopped once a cancel event is set, whoever tokenizes (a backend's chat prompt, the chat layer's
predicted output).

``plain_tokens`` counts a text longer than ``CHUNK_CHARS`` in chunks cut before a space, so that
a 16 MiB text is refused after the chunks that pass the budget, not after tokenizing all of it;
a text that fits is then tokenized whole, so its ids do not depend on the chunks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator

CHUNK_CHARS = 16384  # the most text one tokenizer call counts while a prompt may be refused
_CUT_WINDOW = 256  # how far back from a chunk's end a space is looked for
_CUT_SLACK = 2  # tokens a cut may add (a word split in two, a space prefix)

Tokenize = Callable[[str], list[int]]


class PromptOverLimit(Exception):
    """The prompt has more than ``limit`` tokens: at least ``tokens`` (the work stopped there)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"the prompt has at least {tokens} tokens, more than {limit}")
        self.tokens = tokens
        self.limit = limit


class PromptCancelled(Exception):
    """The prompt's tokenization was cancelled."""


def plain_tokens(text: str, tokenize: Tokenize, room: int | None = None,
                 cancel: threading.Event | None = None, before: int = 0) -> list[int]:
    """``tokenize(text)``; ``PromptOverLimit`` (counting ``before`` tokens ahead of it) as soon
    as it is known to have more than ``room`` tokens, ``PromptCancelled`` once ``cancel`` is
    set. Text longer than ``CHUNK_CHARS`` is counted in chunks first."""
    _check(cancel)
    if len(text) > CHUNK_CHARS and room is not None:
        counted = 0
        for cuts, chunk in enumerate(_chunks(text)):
            counted += len(tokenize(chunk))
            if counted - _CUT_SLACK * cuts > room:
                raise PromptOverLimit(before + counted - _CUT_SLACK * cuts, before + room)
            _check(cancel)
    tokens = tokenize(text)
    if room is not None and len(tokens) > room:
        raise PromptOverLimit(before + len(tokens), before + room)
    return tokens


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise PromptCancelled()


def _chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of at most ``CHUNK_CHARS``, each cut just before a space that follows
    other text where the last ``_CUT_WINDOW`` characters have one (a tokenizer's word
    boundary)."""
    start = 0
    while len(text) - start > CHUNK_CHARS:
        end = start + CHUNK_CHARS
        window = text[end - _CUT_WINDOW:end]
        match = None
        for match in re.finditer(r"\S(?=\s)", window):
            pass
        if match is not None:
            end = end - _CUT_WINDOW + match.end()
        yield text[start:end]
        start = end
    yield text[start:]
