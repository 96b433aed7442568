"""Chat prompts in which only the chat template's own markup can become control tokens.

``template_parts`` renders a chat template with each message's content replaced by a unique
sentinel (a random nonce between private-use characters, which no text can guess), so that the
rendered text splits into the template's markup and the contents, wherever the template puts
them. A template that trims a content (jinja's ``trim``) is detected by a second render with the
sentinels padded, and the content is trimmed as the template would have.

A message's tool calls pass through the template as they are; the JSON texts the template
writes of tools and call arguments (``literals``, from ``chat_template.tool_literals``) are cut
out of the markup as content parts, so that they too stay plain text. An empty content is
rendered empty (a template that tests it sees it empty).

``assemble`` tokenizes the parts: in the markup, the texts of the model's control tokens
(``ControlTokens``) become their ids; everything else, the markup's plain text and every content,
is tokenized as plain text, one stretch between two control tokens at a time. A control-token
parsing tokenizer partitions a whole prompt at the same places, so ordinary text gets the ids it
always had, while a content that spells ``<|im_end|>`` stays those characters.

Bounded and cancellable: the stretches are tokenized one after another (one per message with a
template that closes each turn with a control token), and a stretch longer than ``CHUNK_CHARS`` is
first counted in chunks cut before a space; ``limit`` stops the work with ``PromptOverLimit`` as
soon as the prompt is known to pass it, and ``cancel`` stops it with ``PromptCancelled`` between
two stretches or chunks. A stretch that fits is then tokenized whole, so its ids do not depend on
the chunks.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from chatapp.backends.chat_template import TemplateMessage
from chatapp.text_budget import (
    CHUNK_CHARS,
    PromptCancelled,
    PromptOverLimit,
    Tokenize,
    plain_tokens,
)

Render = Callable[[Sequence[TemplateMessage]], tuple[str, bool]]


@dataclass(frozen=True)
class PromptPart:
    """A piece of a rendered prompt: a message's ``content`` (plain text), else markup."""

    text: str
    content: bool


class ControlTokens:
    """The texts of a model's control tokens and their ids; ``split`` finds them in markup."""

    def __init__(self, texts: Mapping[str, int]) -> None:
        self._ids = {text: token for text, token in texts.items() if text}
        ordered = sorted(self._ids, key=len, reverse=True)  # the longest text wins a tie
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def split(self, markup: str) -> Iterator[str | int]:
        """``markup`` as plain text pieces (str) and control token ids (int), in order."""
        if self._pattern is None:
            yield markup
            return
        start = 0
        for match in self._pattern.finditer(markup):
            if match.start() > start:
                yield markup[start:match.start()]
            yield self._ids[match.group()]
            start = match.end()
        if start < len(markup):
            yield markup[start:]


@dataclass(frozen=True)
class _Placeholder:
    """A message whose content stands for the real one while the template renders."""

    role: str
    content: str
    tool_calls: tuple[object, ...] = field(default=())


def template_parts(render: Render, messages: Sequence[TemplateMessage],
                   literals: Sequence[str] = ()) -> tuple[list[PromptPart], bool]:
    """``render``'s prompt for ``messages`` as markup and content parts; the second value is
    ``render``'s (the fallback template was used). The contents never pass through the
    template, so its cost does not grow with their length; ``literals`` found in the markup
    become content parts."""
    nonce = secrets.token_hex(8)
    marks = [f"\ue000{nonce}.{i}\ue001" if m.content else "" for i, m in enumerate(messages)]
    text, fallback = render(_placeholders(messages, marks, ""))
    padded, _ = render(_placeholders(messages, marks, " "))
    contents = [_as_rendered(m.content, mark, padded) for m, mark in zip(messages, marks)]
    pattern = re.compile(f"\ue000{nonce}\\.(\\d+)\ue001")
    parts, start = [], 0
    for match in pattern.finditer(text):
        parts.extend(_markup(text[start:match.start()], literals))
        parts.append(PromptPart(contents[int(match.group(1))], True))
        start = match.end()
    parts.extend(_markup(text[start:], literals))
    return [part for part in parts if part.text], fallback


def _placeholders(messages: Sequence[TemplateMessage], marks: Sequence[str], pad: str
                  ) -> list[_Placeholder]:
    return [_Placeholder(m.role, f"{pad}{mark}{pad}" if mark else "",
                         tuple(getattr(m, "tool_calls", ())))
            for m, mark in zip(messages, marks)]


def _markup(text: str, literals: Sequence[str]) -> list[PromptPart]:
    """``text`` (markup) as parts, each of ``literals`` in it a content part."""
    found = [literal for literal in literals if literal and literal in text]
    if not found:
        return [PromptPart(text, False)]
    pattern = re.compile("|".join(map(re.escape, sorted(found, key=len, reverse=True))))
    parts, start = [], 0
    for match in pattern.finditer(text):
        parts.append(PromptPart(text[start:match.start()], False))
        parts.append(PromptPart(match.group(), True))
        start = match.end()
    parts.append(PromptPart(text[start:], False))
    return parts


def _as_rendered(content: str, mark: str, padded: str) -> str:
    """``content`` stripped on the sides where the template stripped its padded sentinel."""
    if f" {mark}" not in padded:
        content = content.lstrip()
    if f"{mark} " not in padded:
        content = content.rstrip()
    return content


def assemble(parts: Sequence[PromptPart], controls: ControlTokens, tokenize: Tokenize,
             limit: int | None = None, cancel: threading.Event | None = None) -> list[int]:
    """The token ids of ``parts``: control tokens only from the markup, the rest plain text
    (``tokenize`` parses no control token); see the module docstring for ``limit`` and
    ``cancel``."""
    tokens: list[int] = []
    stretch: list[str] = []

    def flush() -> None:
        if stretch:
            room = None if limit is None else limit - len(tokens)
            tokens.extend(plain_tokens("".join(stretch), tokenize, room, cancel, len(tokens)))
            stretch.clear()

    for part in parts:
        pieces = [part.text] if part.content else controls.split(part.text)
        for piece in pieces:
            if isinstance(piece, str):
                stretch.append(piece)
                continue
            flush()
            tokens.append(piece)
            if limit is not None and len(tokens) > limit:
                raise PromptOverLimit(len(tokens), limit)
    flush()
    return tokens


__all__ = ["CHUNK_CHARS", "ControlTokens", "PromptCancelled", "PromptOverLimit", "PromptPart",
           "Tokenize", "assemble", "plain_tokens", "template_parts"]
