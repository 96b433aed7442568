"""The chat history's SQLite schema and its migrations.

Layout (schema version in ``PRAGMA user_version``; ``MIGRATIONS[i]`` brings version i to i + 1):

- ``chats``: id, title, draft and target model names, created_at, updated_at (Unix seconds).
- ``messages``: chat_id, position in the chat, role, content, ``runs`` (assistant only: the reply
  as a JSON list of ``[text, source]`` runs, consecutive tokens of one source merged, source being
  a ``TokenSource`` value), finish_reason (``stop`` | ``length`` | ``cancelled`` | ``error``),
  created_at.
- ``turn_stats``: one row per assistant message: ``TurnStats.to_json()`` and a small ``meta``
  object (draft length label, sampling settings, model names) as JSON.
- ``messages_fts`` (schema 2): an FTS5 index of ``messages.content`` (external content: the text
  lives in ``messages`` only), kept in step by triggers on insert, update and delete (a chat's
  deletion cascades to its messages and so to the index). Opening an older history builds it
  from the messages there.
- ``messages.attachments`` (schema 3): the files sent with a user message, as a JSON list of
  ``Attachment.to_json()`` objects (path, language, text as sent); NULL when none. The search
  index holds the typed text only.
- ``chats.settings`` (schema 4): the settings the chat goes on with, ``ChatSettings.to_json()``
  (its preset's name, sampling, K, drafter, system prompt...) as JSON; NULL for a chat saved
  before (it is answered with the settings in force).
"""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE chats (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            draft TEXT NOT NULL DEFAULT '',
            target TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            runs TEXT,
            finish_reason TEXT,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX messages_by_chat ON messages (chat_id, position)",
        """CREATE TABLE turn_stats (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            stats TEXT NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}'
        )""",
    ),
    (
        """CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2'
        )""",
        """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
        END""",
        """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts (messages_fts, rowid, content)
                VALUES ('delete', old.id, old.content);
        END""",
        """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts (messages_fts, rowid, content)
                VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
        END""",
        "INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')",
    ),
    ("ALTER TABLE messages ADD COLUMN attachments TEXT",),
    ("ALTER TABLE chats ADD COLUMN settings TEXT",),
)
SCHEMA_VERSION = len(MIGRATIONS)
