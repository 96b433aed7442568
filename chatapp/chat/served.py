"""What the API server served, kept: its chats in the history (``--save`` only) and its keys in
the default drafter's suffix index.

``ServedChats`` decides under which key of the suffix index (``SuffixSource``) each exchange's
text goes: a key of its own per exchange, so the index keeps what was served (an agent re-sends
its conversation and repeats itself) within its capacity, in memory only. With a history
(``--save``) each exchange is also written as a chat, and its text is indexed under that chat's
id, as the chat app's are, so that the next start indexes it again from the history. An exchange
whose messages are an earlier saved exchange's plus its reply and a new message (an agent's next
request) continues that chat instead of starting another.

Used from the one worker thread that runs the models (SQLite stays on its thread).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from chatapp.backends.chat_template import ChatMessage
from chatapp.chat.history import ChatSummary, HistoryStore, StoredMessage
from chatapp.chat.terminal_text import printable_line
from chatapp.drafters.suffix import SuffixSource
from chatapp.drafters.suffix_index import ChatKey
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
    """See the module docstring. ``index``: the default drafter's suffix index (None: the
    drafter has none); ``history``: the store to save to (None: nothing is saved)."""

    def __init__(self, index: SuffixSource | None, history: HistoryStore | None = None,
                 draft: str = "", target: str = "") -> None:
        self.index = index
        self.history = history
        self.draft = draft
        self.target = target
        self._served = 0
        self._chats: OrderedDict[str, int] = OrderedDict()  # conversation digest -> chat id

    def begin(self, messages: Sequence[ChatMessage]) -> int | None:
        """An exchange of ``messages`` starts: its text goes under its key in the index from
        now on. Returns the saved chat it continues, if any."""
        chat = self._chats.get(conversation_key(messages[:-1])) if messages else None
        self._served += 1
        key: ChatKey = chat if chat is not None else (SERVED, self._served)
        if self.index is not None:
            self.index.open_chat(key)
        return chat

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
        if self.index is not None:
            self.index.save_as(chat)
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
    return [StoredMessage(0, 0, m.role, m.content, now) for m in messages]
