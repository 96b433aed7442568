"""One message of a conversation, as the models see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatMessage:
    """``role``: "system", "user" or "assistant"; ``content``: the text (with any attached
    files). The backends render any value with these two fields
    (``chatapp.backends.chat_template.TemplateMessage``)."""

    role: str
    content: str
