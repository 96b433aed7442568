"""The saved chats for the front ends: list, search, rename, export and import them.

Front ends never open the SQLite history themselves (the import contracts forbid it); they hold a
``SavedChats`` and call it, and catch ``HistoryError`` and ``ChatFileError`` (both
``UserFacingError``: their messages say what is wrong and what to do). Exports come as text in
one of ``EXPORT_FORMATS``: ``md`` (Markdown to read) or ``json`` (``chatapp.chat.chat_file``, to
import on another machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType

from chatapp.chat.chat_file import ChatFileError, chat_from_json, chat_to_json
from chatapp.chat.history import ChatSummary, HistoryError, HistoryStore, SearchHit, chat_markdown

EXPORT_FORMATS = ("md", "json")

__all__ = ["EXPORT_FORMATS", "ChatFileError", "ChatSummary", "HistoryError", "NoSuchChat",
           "SavedChats", "SearchHit"]


class NoSuchChat(HistoryError):
    """A chat id that is not in the history."""


class SavedChats:
    """The chats of the history at ``path`` (None: the user's history), used from one thread."""

    def __init__(self, path: Path | None = None) -> None:
        self.history = HistoryStore(path)

    def __enter__(self) -> SavedChats:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.history.close()

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, the most recently used first."""
        return self.history.list_chats()

    def get(self, chat_id: int) -> ChatSummary:
        """Chat ``chat_id``; ``NoSuchChat`` when there is none."""
        chat = self.history.get_chat(chat_id)
        if chat is None:
            raise NoSuchChat(f"There is no chat {chat_id} in the history at "
                               f"{self.history.path}.")
        return chat

    def search(self, text: str, limit: int = 50,
               mark: tuple[str, str] = ("", "")) -> list[SearchHit]:
        """The messages of every chat holding every word of ``text`` (a word may be the start
        of a longer one), the best match first; each matching word of a hit's snippet is put
        between the ``mark`` strings."""
        return self.history.search(text, limit, mark)

    def rename(self, chat_id: int, title: str) -> None:
        self.get(chat_id)
        self.history.rename_chat(chat_id, title)

    def export(self, chat_id: int, export_format: str) -> str:
        """Chat ``chat_id`` as text in ``export_format`` (one of ``EXPORT_FORMATS``)."""
        if export_format not in EXPORT_FORMATS:
            raise ValueError(f"unknown export format {export_format!r}")
        chat = self.get(chat_id)
        messages = self.history.messages(chat_id)
        if export_format == "md":
            return chat_markdown(chat, messages)
        return json.dumps(chat_to_json(chat, messages), ensure_ascii=False, indent=1) + "\n"

    def import_json(self, text: str) -> int:
        """A new chat made from a JSON export's ``text``, saved whole or not at all; returns its
        id. ``ChatFileError`` when the text is not a chat file this version reads."""
        chat, messages = chat_from_json(text)
        return self.history.insert_chat(chat, messages)
