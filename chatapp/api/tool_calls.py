"""A reply's tool calls, found in its text as it streams.

A chat template that takes tools (Qwen2.5's, Hermes-style) has the model write each call as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. ``ToolCallStream`` reads a reply's
text delta by delta and gives back, in order, the text outside the calls (``str``), each call's
start (``CallStart``: its index, an id ``call_<hex>``, the function's name) and its arguments
as fragments (``ArgumentsPart``): the arguments' text streams as the model writes it once the
call's name is known, and the fragments of one call join to exactly its ``ToolCall.arguments``.
A whole reply is read by the same machine (``parse_reply``), so a streamed reply and the same
reply whole always agree.

What counts as a call: a tagged object whose ``name`` is a declared function and which has
``arguments`` (an object, or a JSON text). With the choice "auto", "required" or a named
function, a reply that is only such an object (optionally in a ``` fence, its braces optionally
doubled) is a call too: the small models often write it so, imitating the example
``{{"name": ...}}`` that Qwen2.5's template prints. Such a reply is held back while it may still
be one (until its fence is followed by anything but ``{``, or text follows its JSON object).
Anything else, an unknown name or a tag that does not parse, stays text. White space around
the calls and at the reply's ends is dropped. With ``parallel`` off only the first call counts
(later ones are dropped). With the choice "none" (or no tools) the text is the reply.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from chatapp.chat.message import ToolCall
from chatapp.chat.tools import Tools

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


@dataclass(frozen=True)
class CallStart:
    """A call begins: its position among the reply's calls, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPart:
    """More of call ``index``'s arguments (JSON text)."""

    index: int
    text: str


StreamItem = str | CallStart | ArgumentsPart


@dataclass(frozen=True)
class ToolReply:
    """A whole reply read for calls: the text outside them (None when there is none) and the
    calls."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_reply(text: str, tools: Tools) -> ToolReply:
    """``text`` read as ``ToolCallStream`` reads it."""
    stream = ToolCallStream(tools)
    items = stream.push(text) + stream.finish()
    content = "".join(item for item in items if isinstance(item, str))
    return ToolReply(content or None, tuple(stream.calls))


@dataclass
class _OpenCall:
    """A tagged call being read: its text so far, and once its name is known, its start and
    how much of the arguments was given out."""

    body: str = ""
    start: CallStart | None = None
    given: int = 0  # characters of the arguments (from ``args_at``) given out
    args_at: int = 0


@dataclass
class ToolCallStream:
    """Reads one reply's text for ``tools``' calls; see the module docstring."""

    tools: Tools
    calls: list[ToolCall] = field(default_factory=list)
    _text: str = ""  # text not yet read through (a possible tag, an open call, a held reply)
    _call: _OpenCall | None = None
    _began: bool = False  # the reply showed something other than white space
    _held: bool = False  # the whole reply may be one bare JSON call
    _space: str = ""  # white space after the text given out, given only if text follows
    _edge: bool = True  # at the reply's start or right after a call: white space is dropped

    @property
    def active(self) -> bool:
        return self.tools.callable

    def push(self, delta: str) -> list[StreamItem]:
        """Read ``delta``; what can be given out now."""
        if not self.active:
            return [delta] if delta else []
        self._text += delta
        if not self._began and self._text.strip():
            self._began = True
            self._held = self._text.lstrip()[:1] in ("{", "`")
        if self._held and _may_be_bare_call(self._text):
            return []
        self._held = False
        return self._advance()

    def finish(self) -> list[StreamItem]:
        """The reply ended: what is left."""
        if not self.active:
            return []
        if self._held:
            return self._finish_held()
        items = self._advance()
        if self._call is not None:  # a call left open: a call if its body parses
            items += self._close(self._text)
        else:
            items += self._visible(self._text)
        self._text = ""
        return items

    # -- tagged calls -----------------------------------------------------------------------

    def _advance(self) -> list[StreamItem]:
        items: list[StreamItem] = []
        while True:
            if self._call is not None:
                end = self._text.find(CLOSE)
                if end < 0:  # (a closing tag on its way is not the call's text)
                    items += self._call_progress(
                        self._text[:len(self._text) - _partial_tag(self._text, CLOSE)])
                    return items
                items += self._close(self._text[:end])
                self._text = self._text[end + len(CLOSE):]
                continue
            start = self._text.find(OPEN)
            if start < 0:
                keep = len(self._text) - _partial_tag(self._text, OPEN)
                items += self._visible(self._text[:keep])
                self._text = self._text[keep:]
                return items
            items += self._visible(self._text[:start])
            self._text = self._text[start + len(OPEN):]
            self._call = _OpenCall()
            self._space = ""

    def _call_progress(self, body: str) -> list[StreamItem]:
        """Give out what is sure of the open call, ``body`` its text so far: its start once the
        name is read, then its arguments up to the last ``}`` (which may close the call's
        object)."""
        call = self._call
        assert call is not None
        items: list[StreamItem] = []
        if call.start is None:
            header = _HEADER.match(body)
            if (header is None or header.end() == len(body)  # white space may follow
                    or header.group(1) not in self.tools.names or self._full()):
                return items
            call.start = CallStart(len(self.calls), new_call_id(), header.group(1))
            call.args_at = header.end()
            items.append(call.start)
        at = call.args_at + call.given
        sure = body[at:max(at, body.rfind("}"))].rstrip()
        if sure:
            items.append(ArgumentsPart(call.start.index, sure))
            call.given += len(sure)
        return items

    def _close(self, body: str) -> list[StreamItem]:
        """The open call's end, ``body`` its whole text: the rest of its arguments once its
        name was read (whether the text came at once or in pieces), else the call whole if
        ``body`` is one; text if it is no call."""
        items = self._call_progress(body)
        call, self._call = self._call, None
        assert call is not None
        self._edge = True
        if call.start is not None:
            arguments = _arguments_of(body[call.args_at:].rstrip())
            self.calls.append(ToolCall(call.start.id, call.start.name, arguments))
            rest = arguments[call.given:]
            return items + [ArgumentsPart(call.start.index, rest)] * bool(rest)
        parsed = self._as_call(body)
        if parsed is None:
            self._edge = False
            return self._visible(OPEN + body + CLOSE)
        return [] if self._full() else self._emit(*parsed)

    # -- bare JSON calls ----------------------------------------------------------------------

    def _finish_held(self) -> list[StreamItem]:
        text, self._text, self._held = self._text.strip(), "", False
        fenced = _FENCE.match(text)
        parsed = self._as_call(fenced.group(1) if fenced else text)
        if parsed is None:
            self._text = text
            return self.finish()
        return self._emit(*parsed)

    # -- helpers --------------------------------------------------------------------------------

    def _as_call(self, body: str) -> tuple[str, str] | None:
        """``(name, arguments)`` if ``body`` is a call of a declared function (its braces may
        be doubled, as Qwen2.5's template prints its example call)."""
        value = _json(body)
        if value is None and body.strip().startswith("{{") and body.strip().endswith("}}"):
            value = _json(body.strip()[1:-1])
        if not (isinstance(value, dict) and value.get("name") in self.tools.names
                and "arguments" in value):
            return None
        arguments = value["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return value["name"], arguments

    def _emit(self, name: str, arguments: str) -> list[StreamItem]:
        start = CallStart(len(self.calls), new_call_id(), name)
        self.calls.append(ToolCall(start.id, name, arguments))
        return [start, ArgumentsPart(start.index, arguments)]

    def _full(self) -> bool:
        """No more calls count (one was made and parallel calls are off)."""
        return not self.tools.parallel and bool(self.calls)

    def _visible(self, text: str) -> list[StreamItem]:
        """Text outside the calls, less the white space at the reply's ends and around calls
        (held in ``_space`` until text follows it)."""
        if self._edge:
            text = text.lstrip()
        if not text:
            return []
        self._edge = False
        body = text.rstrip()
        if not body:
            self._space += text
            return []
        shown, self._space = self._space + body, text[len(body):]
        return [shown]


def _may_be_bare_call(text: str) -> bool:
    """Whether a reply that begins with ``text`` may still be only a JSON object, in a fence or
    not (it is held back while it may)."""
    text = text.lstrip()
    if text.startswith("`"):
        if not ("```".startswith(text[:3]) or text.startswith("```")):
            return False
        newline = text.find("\n")
        if newline < 0:
            return True
        text = text[newline + 1:].lstrip()
        if not text:
            return True
    if not text.startswith("{"):
        return False
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return True  # not whole yet (or doubled braces): only its end can tell
    rest = text[end:].strip()
    return "```".startswith(rest)


def _arguments_of(tail: str) -> str:
    """A streamed call's arguments, from ``tail``, its text after ``"arguments":``: less the
    ``}`` that closes the call's object, unless the model left that out (then the tail without
    it is no JSON, the whole tail is)."""
    if tail.endswith("}"):
        inner = tail[:-1].rstrip()
        if _json(inner) is not None or _json(tail) is None:
            return inner
    return tail


def _json(text: str) -> Any:
    """``text`` as JSON; None if it is not."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0

