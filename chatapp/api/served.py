"""What the API server served, kept: its chats in the history (``--save`` only) and its keys in
the default drafter's suffix index.

``ServedChats`` decides under which key of the suffix index each exchange's text goes (the
reply's ``DraftHints.document``): a key of its own per exchange, so the index keeps what was
served (an agent re-sends its conversation and repeats itself) within its capacity, in memory
only. With a history
(``--save``) each exchange is also written as a chat, and its text is indexed under that chat's
id (``DraftHints.renamed``, with the next exchange), as the chat app's are, so that the next
start indexes it again from the history. An exchange
whose messages are an earlier saved exchange's plus its reply and a new message (an agent's next
request) continues that chat instead of starting another. Tool results and tool calls are saved
in the chat template's tags (the history has no tool role).

Used from the one worker thread that runs the models (SQLite stays on its thread).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from chatapp.chat.history import ChatSummary, HistoryStore, StoredMessage
from chatapp.chat.message import ChatMessage
from chatapp.chat.terminal_text import printable_line
from chatapp.engine.contracts import DraftHints
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats

TITLE_LENGTH = 60
REMEMBERED_CHATS = 256  # saved conversations an exchange may continue (the latest ones)
SERVED = "served"  # the first part of the index key of an exchange not saved


def conversation_key(messages: Sequence[ChatMessage]) -> str:
    """A digest of ``messages`` (roles and contents, in order)."""
    data = json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


class ServedChats:
    """See the module docstring. ``history``: the store to save to (None: nothing is saved)."""

    def __init__(self, history: HistoryStore | None = None, draft: str = "",
                 target: str = "") -> None:
        self.history = history
        self.draft = draft
        self.target = target
        self._served = 0
        self._chats: OrderedDict[str, int] = OrderedDict()  # conversation digest -> chat id
        self._key: Hashable | None = None  # the index key of the latest exchange
        self._renamed: dict[Hashable, Hashable] = {}  # saved since the last exchange: key -> chat

    def hints(self, messages: Sequence[ChatMessage], predicted: Sequence[int] = (),
              ) -> tuple[int | None, DraftHints]:
        """The saved chat an exchange of ``messages`` would continue, if any, and its reply's
        hints (its text under a key of its own in the index, with the ``predicted`` output's
        tokens); ``begin`` makes them the exchange's once its prompt is accepted."""
        chat = self._chats.get(conversation_key(messages[:-1])) if messages else None
        key: Hashable = chat if chat is not None else (SERVED, self._served + 1)
        return chat, DraftHints(tuple(predicted), key, self._renamed)

    def begin(self, hints: DraftHints) -> None:
        """The exchange of ``hints`` (from ``hints``) starts: its text goes under their key."""
        self._served += 1
        self._key = hints.document  # type: ignore[assignment]
        self._renamed = {}

    def save(self, messages: Sequence[ChatMessage], chat: int | None, reply: str,
             pieces: Sequence[tuple[str, TokenSource]], stats: TurnStats, finish_reason: str,
             meta: dict[str, Any]) -> int | None:
        """Write the exchange to the history in one transaction (``chat``: the chat it
        continues, from ``begin``); its chat id, or None without a history."""
        if self.history is None:
            return None
        now = time.time()
        answer = StoredMessage(0, 0, "assistant", reply, now, list(pieces), finish_reason, stats,
                               meta)
        if chat is None or self.history.get_chat(chat) is None:
            first = next((m.content for m in messages if m.role == "user"), "API request")
            summary = ChatSummary(0, printable_line(first)[:TITLE_LENGTH], self.draft,
                                  self.target, now, now, 0)
            chat = self.history.insert_chat(summary, [*_stored(messages, now), answer], now)
        else:
            self.history.append_messages(chat, [*_stored(messages[-1:], now), answer], now)
        if self._key is not None and self._key != chat:
            self._renamed[self._key] = chat
        key = conversation_key([*messages, ChatMessage("assistant", reply)])
        self._chats[key] = chat
        self._chats.move_to_end(key)
        while len(self._chats) > REMEMBERED_CHATS:
            self._chats.popitem(last=False)
        return chat

    def close(self) -> None:
        if self.history is not None:
            self.history.close()


def _stored(messages: Sequence[ChatMessage], now: float) -> list[StoredMessage]:
    return [StoredMessage(0, 0, *_as_chat(m), now) for m in messages]


def _as_chat(message: ChatMessage) -> tuple[str, str]:
    """A message in the history's roles (system, user, assistant): a tool's result becomes a
    user message in ``<tool_response>`` tags, an assistant's tool calls follow its text in
    ``<tool_call>`` tags, as Qwen2.5's template writes them (the app shows such calls folded)."""
    if message.role == "tool":
        return "user", f"<tool_response>\n{message.content}\n</tool_response>"
    calls = [f'<tool_call>\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}'
             "\n</tool_call>" for call in message.tool_calls]
    return message.role, "\n".join([message.content, *calls] if message.content else calls)
