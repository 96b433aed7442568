"""The saved chats, as a conversation and its front ends reach them: listed, searched, renamed,
deleted, exported and imported here, never through the history store itself.

``SavedChats`` stands in front of a ``chatapp.chat.history.HistoryStore``, or of none (a session
whose history could not be opened saves nothing and lists no chat). A conversation holds one as
``Conversation.chats`` and makes its own writes through ``write``, which reports a failed write
through ``on_write_error`` instead of raising: a full disk never stops a chat. What the user asks
for and cannot have (a rename to an empty title, an export to a folder that cannot be written,
any action without a history) raises a ``UserFacingError`` that says what to do.

Exports come as text in one of ``EXPORT_FORMATS``: ``md`` (Markdown to read) or ``json``
(``chatapp.chat.chat_file``, to import on another machine); a file that is not a chat export
raises ``ChatFileError``. ``SavedChats.at(path)`` opens a history for a command (a context manager).

Threads: SQLite keeps a connection on the thread that opened it; every method runs there.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from chatapp.chat.chat_file import ChatFileError, chat_from_json, chat_to_json
from chatapp.chat.chat_settings import ChatSettings
from chatapp.chat.history import (
    ChatSummary,
    HistoryError,
    HistoryStore,
    SearchHit,
    chat_markdown,
)
from chatapp.chat.terminal_text import printable_line
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config

__all__ = ["EXPORT_FORMATS", "TITLE_LENGTH", "ChatFileError", "ChatSummary", "ChatsError",
           "NoSuchChat", "SavedChats", "SearchHit", "chat_title"]

EXPORT_FORMATS = ("md", "json")

# The longest title a chat gets from its first message or a rename.
TITLE_LENGTH = 60


class ChatsError(UserFacingError):
    """A chat action that cannot be done: no history, an empty title, an export that failed."""


class NoSuchChat(HistoryError):
    """A chat id that is not in the history (never was, or was deleted)."""


def chat_title(text: str) -> str:
    """The title of a chat made from ``text``: printable, on one line (each run of whitespace one
    space), cut at ``TITLE_LENGTH`` characters."""
    return printable_line(text)[:TITLE_LENGTH]


def _ignore(message: str) -> None:
    """The default ``on_write_error``: say nothing."""


def _forget(chat_id: int) -> None:
    """The default ``on_delete``: nothing else keeps chats."""


class SavedChats:
    """The chats of one history (see the module docstring). ``on_delete(chat_id)`` runs after a
    chat was deleted, for whatever else keeps it (the drafter's index of the history)."""

    def __init__(self, store: HistoryStore | None = None, *,
                 on_write_error: Callable[[str], None] | None = None,
                 on_delete: Callable[[int], None] = _forget) -> None:
        self.store = store
        self.on_write_error = on_write_error or _ignore
        self.on_delete = on_delete

    @classmethod
    def at(cls, path: Path | None = None) -> SavedChats:
        """The chats of the history at ``path`` (None: the user's), opened now; a
        ``UserFacingError`` says why it cannot be."""
        chats = cls()
        chats.open(path)
        return chats

    def __enter__(self) -> SavedChats:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def open(self, path: Path | None = None) -> None:
        """Open the history at ``path`` (None: the default place); a ``UserFacingError`` says
        why it cannot be opened, and the chats stay unavailable then."""
        self.store = HistoryStore(path)

    def close(self) -> None:
        """Close the history; the chats are unavailable from now on."""
        store, self.store = self.store, None
        if store is not None:
            store.close()

    @property
    def available(self) -> bool:
        return self.store is not None

    def list_chats(self) -> list[ChatSummary]:
        """Every saved chat, the most recently used first (none without a history)."""
        return self.store.list_chats() if self.store is not None else []

    def latest(self) -> int | None:
        """The id of the chat used last, None when there is none."""
        chats = self.list_chats()
        return chats[0].id if chats else None

    def exists(self, chat_id: int) -> bool:
        """Whether chat ``chat_id`` is saved (False once deleted, and without a history)."""
        return self.store is not None and self.store.get_chat(chat_id) is not None

    def get(self, chat_id: int, purpose: str = "read") -> ChatSummary:
        """Chat ``chat_id``; ``NoSuchChat`` when there is none, a ``ChatsError`` naming
        ``purpose`` when the history cannot be read."""
        store = self._require()
        chat = self._act(purpose, store.get_chat, chat_id)
        if chat is None:
            raise NoSuchChat(f"There is no chat {chat_id} in the history at {store.path}.")
        return chat

    def rename(self, chat_id: int, title: str) -> str:
        """Give chat ``chat_id`` the title ``title`` (as ``chat_title`` makes it, without spaces
        at its ends); returns the title stored."""
        store = self._require()
        title = chat_title(title).strip()
        if not title:
            raise ChatsError("A chat needs a title: type one, or press Esc to keep the old one.")
        self.get(chat_id, "rename")
        self._act("rename", store.rename_chat, chat_id, title)
        return title

    def search(self, text: str, limit: int = 50,
               mark: tuple[str, str] = ("", "")) -> list[SearchHit]:
        """The messages of every chat holding every word of ``text`` (a word may be the start
        of a longer one), the best match first; each matching word of a hit's snippet is put
        between the ``mark`` strings. A damaged search index raises ``ChatsError``."""
        return self._act("search", self._require().search, text, limit, mark)

    def export(self, chat_id: int, export_format: str) -> str:
        """Chat ``chat_id`` as text in ``export_format`` (one of ``EXPORT_FORMATS``)."""
        if export_format not in EXPORT_FORMATS:
            raise ValueError(f"unknown export format {export_format!r}")
        chat = self.get(chat_id, "export")
        messages = self._act("export", self._require().messages, chat_id)
        if export_format == "md":
            return chat_markdown(chat, messages)
        return json.dumps(chat_to_json(chat, messages), ensure_ascii=False, indent=1) + "\n"

    def import_json(self, text: str) -> int:
        """A new chat made from a JSON export's ``text``, saved whole or not at all; returns its
        id. ``ChatFileError`` when the text is not a chat file this version reads."""
        chat, messages = chat_from_json(text)
        return self._act("import", self._require().insert_chat, chat, messages)

    def delete(self, chat_id: int) -> None:
        """Delete chat ``chat_id`` for good, from the history and from ``on_delete``'s keeper."""
        store = self._require()
        self._act("delete", store.delete_chat, chat_id)
        self.on_delete(chat_id)

    def export_markdown(self, chat_id: int, directory: Path | None = None) -> Path:
        """Write chat ``chat_id`` as Markdown into a file of its own in ``directory`` (None:
        the documents folder); returns the file's path."""
        store = self._require()
        try:
            return store.export_markdown(chat_id, directory)
        except (OSError, sqlite3.Error) as error:
            raise ChatsError(f"Could not export the chat: {error}. Check that the folder "
                             "exists and can be written.") from error

    def start_chat(self, text: str, config: Config) -> int | None:
        """A new chat for the first message ``text`` (its title ``chat_title(text)``) with
        ``config``'s models and settings; its id, None when it could not be saved."""
        if self.store is None:
            return None
        return self.write(self.store.create_chat, chat_title(text), config.draft, config.target,
                          settings=ChatSettings.of(config))

    def record_settings(self, chat_id: int | None, old: Config, new: Config) -> None:
        """Chat ``chat_id`` goes on with ``new`` after ``old``: record its settings, if they
        changed (a failed write is reported as ``write``'s are)."""
        settings = ChatSettings.of(new)
        if self.store is not None and chat_id is not None and settings != ChatSettings.of(old):
            self.write(self.store.set_chat_settings, chat_id, settings)

    def reopened(self, chat_id: int | None, config: Config,
                 given: dict[str, Any] | None = None) -> tuple[Config, str]:
        """The settings chat ``chat_id`` goes on with: those it recorded over ``config`` (none
        recorded, a new chat: ``config``), then ``given`` (the command line's) over them; and a
        note for the user when its preset is no longer in the config ("" otherwise)."""
        chat = self.store.get_chat(chat_id) if self.store is not None and chat_id else None
        settings, note = config, ""
        if chat is not None and chat.settings is not None:
            settings, note = chat.settings.reopened(config)
        return settings.with_overrides(**(given or {})), note

    def remove_message(self, message_id: int | None, chat_id: int | None) -> bool:
        """Delete message ``message_id`` (a reply that never came rolls its message back), and
        chat ``chat_id`` with it when nothing else is left in it; returns whether the chat went.
        Failures are reported as ``write``'s are."""
        if self.store is None or message_id is None:
            return False
        self.write(self.store.delete_message, message_id)
        chat = self.store.get_chat(chat_id) if chat_id is not None else None
        if chat is None or chat.message_count > 0:
            return False
        self.write(self.store.delete_chat, chat.id)
        return True

    def keep_before_edit(self, chat_id: int | None, message_id: int | None) -> str:
        """Copy chat ``chat_id`` as "<its title> (before edit)", then cut it from message
        ``message_id`` on (an edit replaces them); returns the copy's title, "" when nothing was
        kept (no history, a chat or a message never saved, a failed write)."""
        if self.store is None or chat_id is None or message_id is None:
            return ""
        chat = self.store.get_chat(chat_id)
        title = f"{chat.title if chat else 'Chat'} (before edit)"
        if self.write(self.store.copy_chat, chat_id, title) is None:
            return ""
        self.write(self.store.delete_messages_from, message_id)
        return title

    def write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``write(*args, **kwargs)``, a history write: its result, or None when it failed (the
        failure reported through ``on_write_error``, never raised)."""
        try:
            return write(*args, **kwargs)
        except (sqlite3.Error, OSError) as error:
            where = self.store.path if self.store is not None else "the history"
            self.on_write_error(f"Could not save to the history at {where}: {error}. The chat "
                                "goes on unsaved.")
            return None

    def _act(self, what: str, action: Callable[..., Any], *args: Any) -> Any:
        """``action(*args)``, part of what the user asked for: its result; a failure is raised,
        with where the history is."""
        try:
            return action(*args)
        except (sqlite3.Error, OSError) as error:
            where = self.store.path if self.store is not None else "the history"
            raise ChatsError(f"Could not {what} the chat in the history at {where}: {error}. "
                             "Check that the file is still there and its disk has room.") from error

    def _require(self) -> HistoryStore:
        if self.store is None:
            raise ChatsError("The history is not available in this session: the chats cannot "
                             "be listed or changed. Restart specchat once its data folder can "
                             "be written.")
        return self.store
