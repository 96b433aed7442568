"""The chat history: SQLite in the user data dir, one row per chat, message and assistant turn.

The layout and its migrations are in ``chatapp.chat.history_schema``.

The data dir is created 0700 and the database file 0600 (SQLite gives its -wal and -shm files the
database's mode). The store is used from one thread (the UI's); every write is one transaction.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chatapp.chat.attachments import Attachment, message_text
from chatapp.chat.chat_settings import ChatSettings
from chatapp.chat.history_schema import MIGRATIONS, SCHEMA_VERSION
from chatapp.chat.reply_values import finish_text, k_text
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats
from chatapp.errors import UserFacingError
from chatapp.user_files import (
    create_private_file,
    data_dir,
    documents_dir,
    private_dir,
    write_private,
)

Runs = list[tuple[str, TokenSource]]

BUSY_TIMEOUT_MS = 5000  # how long a write waits for another process's write lock
_WAL_TRIES = 50  # switching to WAL while another instance creates the file: 50 x 0.1 s
_WAL_RETRY_S = 0.1


class HistoryError(UserFacingError, RuntimeError):
    """The history database cannot be used; the message says why and what to do."""


def default_history_path() -> Path:
    return data_dir() / "history.sqlite3"


def default_export_dir() -> Path:
    """The user's documents folder when there is one, else an exports folder in the data dir."""
    documents = documents_dir()
    return documents if documents.is_dir() else data_dir() / "exports"


@dataclass(frozen=True)
class ChatSummary:
    id: int
    title: str
    draft: str
    target: str
    created_at: float
    updated_at: float
    message_count: int
    settings: ChatSettings | None = None  # None: saved before chats kept their settings


@dataclass(frozen=True)
class StoredMessage:
    id: int
    chat_id: int
    role: str
    content: str
    created_at: float
    runs: Runs | None = None
    finish_reason: str | None = None
    stats: TurnStats | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    attachments: tuple[Attachment, ...] = ()  # the files sent with a user message


@dataclass(frozen=True)
class SearchHit:
    """A message that matches a search: its chat, and ``snippet``, the words around the match on
    one line, each matching word between the two ``mark`` strings the search was given."""

    chat_id: int
    message_id: int
    title: str
    role: str
    snippet: str
    created_at: float


def match_query(text: str) -> str:
    """``text`` as an FTS5 query: every word must occur, as a word or the start of one (the
    user's punctuation and FTS5's operators are not syntax here); "" when there is no word."""
    return " ".join(f'"{word}"*' for word in re.findall(r"\w+", text))


def encode_runs(runs: Sequence[tuple[str, TokenSource]]) -> str:
    """Runs as compact JSON, merging neighbours of the same source."""
    merged: list[list[str]] = []
    for text, source in runs:
        if not text:
            continue
        if merged and merged[-1][1] == source.value:
            merged[-1][0] += text
        else:
            merged.append([text, source.value])
    return json.dumps(merged, ensure_ascii=False, separators=(",", ":"))


def decode_runs(data: str | None) -> Runs | None:
    if data is None:
        return None
    return [(text, TokenSource(source)) for text, source in json.loads(data)]


class HistoryStore:
    """Chats, messages and per-turn statistics in one SQLite file (WAL mode)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_history_path()
        try:
            create_private_file(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._use_wal()
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.OperationalError as error:
            if not _is_lock(error):
                raise self._unopenable(error) from None
            raise self._busy() from None
        except (OSError, sqlite3.Error) as error:
            raise self._unopenable(error) from None

    def _unopenable(self, error: Exception) -> HistoryError:
        return HistoryError(
            f"The chat history at {self.path} cannot be opened ({error}). Check that the "
            "folder is writable, or move the file away to start a fresh history.")

    def _busy(self) -> HistoryError:
        return HistoryError(
            f"The chat history at {self.path} is being written by another specchat (it waited "
            f"{BUSY_TIMEOUT_MS / 1000:g} s for it): try again once that one is done.")

    def _use_wal(self) -> None:
        """Switch to WAL. The switch needs the file to itself and SQLite does not wait for it
        (busy_timeout does not apply), so while another instance is creating the same new
        history it is retried for up to 5 s."""
        for _ in range(_WAL_TRIES - 1):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error):
                    raise
                time.sleep(_WAL_RETRY_S)
        self._db.execute("PRAGMA journal_mode=WAL")

    # -- schema ---------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        """Bring the schema up to date. A history that is up to date is opened without the
        write lock (another instance may hold it); a migration takes it and reads the version
        again, so that two instances opening a new history at once do not both create it."""
        self._check_version()
        if self.schema_version == SCHEMA_VERSION:
            return
        with self._transaction():
            version = self._check_version()
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number + 1}")

    def _check_version(self) -> int:
        """The schema version; ``HistoryError`` when a newer specchat wrote it."""
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"The chat history at {self.path} was written by a newer specchat (schema "
                f"{version}, this one knows {SCHEMA_VERSION}). Upgrade specchat to open it.")
        return version

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``HistoryError`` when another process kept the write lock
        past the busy timeout."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if _is_lock(error):
                raise self._busy() from None
            raise
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    # -- chats ----------------------------------------------------------------------------------

    def create_chat(self, title: str = "", draft: str = "", target: str = "",
                    now: float | None = None, settings: ChatSettings | None = None) -> int:
        now = time.time() if now is None else now
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO chats (title, draft, target, created_at, updated_at, settings) "
                "VALUES (?, ?, ?, ?, ?, ?)", (title, draft, target, now, now,
                                              _settings_json(settings)))
            return int(cursor.lastrowid)

    def set_chat_settings(self, chat_id: int, settings: ChatSettings) -> None:
        """Record the settings chat ``chat_id`` goes on with (not a use: its time stays)."""
        with self._transaction() as db:
            db.execute("UPDATE chats SET settings = ? WHERE id = ?",
                       (_settings_json(settings), chat_id))

    def rename_chat(self, chat_id: int, title: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def get_chat(self, chat_id: int) -> ChatSummary | None:
        rows = self._chat_rows("WHERE c.id = ?", (chat_id,))
        return rows[0] if rows else None

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, the most recently used first."""
        return self._chat_rows("", ())

    def _chat_rows(self, where: str, args: tuple[Any, ...]) -> list[ChatSummary]:
        rows = self._db.execute(
            "SELECT c.id, c.title, c.draft, c.target, c.created_at, c.updated_at, "
            "(SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id), c.settings "
            f"FROM chats c {where} ORDER BY c.updated_at DESC, c.id DESC", args).fetchall()
        return [ChatSummary(*row[:-1], _stored_settings(row[-1])) for row in rows]

    # -- messages -------------------------------------------------------------------------------

    def add_message(self, chat_id: int, role: str, content: str, *,
                    runs: Sequence[tuple[str, TokenSource]] | None = None,
                    finish_reason: str | None = None, stats: TurnStats | None = None,
                    meta: dict[str, Any] | None = None, now: float | None = None,
                    attachments: Sequence[Attachment] = (), replacing: int | None = None) -> int:
        """Append a message (its turn statistics and attachments, if any) to a chat; returns its
        id. ``replacing``: a message deleted first, in the same transaction (a regenerated
        reply)."""
        now = time.time() if now is None else now
        message = StoredMessage(0, chat_id, role, content, now, list(runs) if runs is not None
                                else None, finish_reason, stats, meta or {}, tuple(attachments))
        with self._transaction() as db:
            if replacing is not None:
                db.execute("DELETE FROM messages WHERE id = ?", (replacing,))
            message_id = self._insert_message(db, chat_id, message)
            db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
            return message_id

    def append_messages(self, chat_id: int, messages: Sequence[StoredMessage],
                        now: float | None = None) -> None:
        """Append ``messages`` (their ids and chat ids ignored) to chat ``chat_id``, all in one
        transaction; it was last used ``now``."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            for message in messages:
                self._insert_message(db, chat_id, message)
            db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))

    @staticmethod
    def _insert_message(db: sqlite3.Connection, chat_id: int, message: StoredMessage) -> int:
        """Append ``message`` (its id and chat id ignored) to chat ``chat_id``, in the caller's
        transaction; returns its id."""
        position = db.execute(
            "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?",
            (chat_id,)).fetchone()[0]
        runs = encode_runs(message.runs) if message.runs is not None else None
        files = json.dumps([attachment.to_json() for attachment in message.attachments],
                           ensure_ascii=False) if message.attachments else None
        cursor = db.execute(
            "INSERT INTO messages (chat_id, position, role, content, runs, finish_reason, "
            "created_at, attachments) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (chat_id, position, message.role, message.content, runs, message.finish_reason,
             message.created_at, files))
        message_id = int(cursor.lastrowid)
        if message.stats is not None:
            db.execute("INSERT INTO turn_stats (message_id, stats, meta) VALUES (?, ?, ?)",
                       (message_id, json.dumps(message.stats.to_json()),
                        json.dumps(message.meta)))
        return message_id

    def delete_message(self, message_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def delete_messages_from(self, message_id: int) -> None:
        """Delete the message ``message_id`` and every later message of its chat."""
        with self._transaction() as db:
            db.execute(
                "DELETE FROM messages WHERE id IN (SELECT later.id FROM messages later JOIN "
                "messages m ON later.chat_id = m.chat_id AND later.position >= m.position "
                "WHERE m.id = ?)", (message_id,))

    def set_turn_meta(self, message_id: int, meta: dict[str, Any]) -> None:
        """Replace the meta of a reply's statistics (a reply without statistics is left alone)."""
        with self._transaction() as db:
            db.execute("UPDATE turn_stats SET meta = ? WHERE message_id = ?",
                       (json.dumps(meta), message_id))

    def copy_chat(self, chat_id: int, title: str) -> int:
        """A new chat titled ``title`` with a copy of every message (and its statistics) of
        ``chat_id``; returns its id."""
        source = self.get_chat(chat_id)
        if source is None:
            raise HistoryError(f"There is no chat {chat_id} in {self.path}.")
        return self.insert_chat(replace(source, title=title), self.messages(chat_id))

    def insert_chat(self, chat: ChatSummary, messages: Sequence[StoredMessage],
                    now: float | None = None) -> int:
        """A new chat with ``chat``'s title, models and creation time (its id and counts are
        ignored) holding ``messages`` (their ids ignored), all in one transaction: the chat is
        saved whole or not at all. It was last used ``now``; returns its id."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO chats (title, draft, target, created_at, updated_at, settings) "
                "VALUES (?, ?, ?, ?, ?, ?)", (chat.title, chat.draft, chat.target,
                                              chat.created_at, now, _settings_json(chat.settings)))
            new_id = int(cursor.lastrowid)
            for message in messages:
                self._insert_message(db, new_id, message)
            return new_id

    def messages(self, chat_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT m.id, m.chat_id, m.role, m.content, m.created_at, m.runs, m.finish_reason, "
            "s.stats, s.meta, m.attachments FROM messages m "
            "LEFT JOIN turn_stats s ON s.message_id = m.id "
            "WHERE m.chat_id = ? ORDER BY m.position", (chat_id,)).fetchall()
        return [
            StoredMessage(
                id=row[0], chat_id=row[1], role=row[2], content=row[3], created_at=row[4],
                runs=decode_runs(row[5]), finish_reason=row[6],
                stats=TurnStats.from_json(json.loads(row[7])) if row[7] else None,
                meta=json.loads(row[8]) if row[8] else {},
                attachments=tuple(Attachment.from_json(item) for item in json.loads(row[9]))
                if row[9] else (),
            )
            for row in rows
        ]

    def search(self, text: str, limit: int = 50,
               mark: tuple[str, str] = ("", "")) -> list[SearchHit]:
        """The messages of every chat that hold every word of ``text`` (see ``match_query``),
        the best match first (FTS5's rank, then the newest), at most ``limit``; [] when ``text``
        has no word."""
        query = match_query(text)
        if not query:
            return []
        rows = self._db.execute(
            "SELECT m.chat_id, m.id, c.title, m.role, "
            "snippet(messages_fts, 0, ?, ?, '…', 12), m.created_at "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "JOIN chats c ON c.id = m.chat_id WHERE messages_fts MATCH ? "
            "ORDER BY messages_fts.rank, m.created_at DESC LIMIT ?",
            (mark[0], mark[1], query, limit)).fetchall()
        return [SearchHit(chat_id, message_id, title, role, " ".join(snippet.split()), created)
                for chat_id, message_id, title, role, snippet, created in rows]

    # -- export ---------------------------------------------------------------------------------

    def export_markdown(self, chat_id: int, directory: Path | None = None) -> Path:
        """Write the chat as Markdown into ``directory``; returns the file's path. The file is
        written atomically and readable by the user only (0600), like the history it comes from;
        a folder created for it is 0700."""
        chat = self.get_chat(chat_id)
        if chat is None:
            raise HistoryError(f"There is no chat {chat_id} in {self.path}.")
        directory = Path(directory) if directory is not None else default_export_dir()
        private_dir(directory)
        slug = re.sub(r"[^a-z0-9]+", "-", chat.title.lower()).strip("-")[:40] or "chat"
        path = directory / f"specchat-{chat.id}-{slug}.md"
        text = chat_markdown(chat, self.messages(chat_id))
        write_private(path, text.encode("utf-8"))
        return path


def _is_lock(error: sqlite3.OperationalError) -> bool:
    """SQLite gave up waiting for another connection's lock."""
    return "locked" in str(error) or "busy" in str(error)


def _settings_json(settings: ChatSettings | None) -> str | None:
    return json.dumps(settings.to_json(), ensure_ascii=False) if settings is not None else None


def _stored_settings(text: str | None) -> ChatSettings | None:
    """The settings of a chat row; None when none were kept, or they no longer read (a value a
    later version no longer allows: the chat goes on with the settings in force)."""
    try:
        return ChatSettings.from_json(json.loads(text)) if text else None
    except ValueError:
        return None


def chat_markdown(chat: ChatSummary, messages: Sequence[StoredMessage]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.created_at))
    lines = [f"# {chat.title or 'Chat'}", ""]
    models = f"draft {chat.draft}, target {chat.target}" if chat.target else ""
    lines += [f"_specchat chat of {stamp}" + (f" ({models})" if models else "") + "_", ""]
    for message in messages:
        heading = {"user": "You", "assistant": "Assistant", "system": "System"}[message.role]
        if message.finish_reason in ("cancelled", "error", "length"):
            heading += f" ({finish_text(message.finish_reason)})"
        lines += [f"## {heading}", "", message_text(message.content, message.attachments), ""]
        if message.stats is not None:
            lines += [f"> {turn_summary(message.stats, message.meta)}", ""]
    return "\n".join(lines)


def turn_summary(stats: TurnStats, meta: dict[str, Any]) -> str:
    parts = [f"{stats.tokens} tokens", f"{stats.tokens_per_s:.1f} tok/s"]
    if k_text(meta.get("k")):
        parts.append(f"K {k_text(meta['k'])}")
    if stats.drafted:
        parts += [f"acceptance {stats.acceptance_rate:.0%}",
                  f"{stats.mean_accepted_length:.2f} tokens per target call"]
    return " · ".join(parts)

