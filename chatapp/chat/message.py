"""One message of a conversation, as the models see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    """A call of a declared function in an assistant message: ``id`` ("call_<hex>"), the
    function's ``name`` and its ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """``role``: "system", "user", "assistant" or "tool" (a tool's result); ``content``: the text
    (with any attached files); ``tool_calls``: an assistant message's calls. The backends render
    any value with these fields (``chatapp.backends.chat_template.TemplateMessage``)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
