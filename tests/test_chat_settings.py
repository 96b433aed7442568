"""A chat's settings kept with it: schema 4 of the history (a schema-3 database, as today's
release makes it, opens and loses nothing), the chat file's "settings" (older files still
import), and what a reopened chat goes on with."""

from __future__ import annotations

import json
import sqlite3

import pytest

from chatapp.chat.attachments import Attachment
from chatapp.chat.chat_settings import ChatSettings
from chatapp.chat.chats import ChatFileError, SavedChats
from chatapp.chat.history import SCHEMA_VERSION, HistoryStore
from chatapp.engine.events import TokenSource
from chatapp.settings.config import Config
from chatapp.settings.presets import CODE_PROMPT, Preset

# The schema-3 database of the release before chats kept their settings, statement by statement
# as that release left it (frozen here: the migrations may change, the files out there do not).
SCHEMA_3 = (
    """CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL DEFAULT '',
        draft TEXT NOT NULL DEFAULT '', target TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL, updated_at REAL NOT NULL)""",
    """CREATE TABLE messages (id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL, runs TEXT, finish_reason TEXT, created_at REAL NOT NULL,
        attachments TEXT)""",
    "CREATE INDEX messages_by_chat ON messages (chat_id, position)",
    """CREATE TABLE turn_stats (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        stats TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}')""",
    """CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages',
        content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content); END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); END""",
    "PRAGMA user_version = 3",
)
FILE = {"path": "src/add.py", "language": "python", "text": "def add(a, b):\n    return a + b\n"}


def schema_3_history(path) -> None:
    db = sqlite3.connect(path)
    for statement in SCHEMA_3:
        db.execute(statement)
    db.execute("INSERT INTO chats VALUES (1, 'Fix add', 'd', 't', 10.0, 13.0)")
    db.execute("INSERT INTO chats VALUES (2, 'Empty', 'd2', 't2', 20.0, 20.0)")
    db.execute("INSERT INTO messages VALUES (1, 1, 0, 'user', 'rename a please', NULL, NULL, "
               "11.0, ?)", (json.dumps([FILE]),))
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'def add(x, b):', "
               "'[[\"def add(\",\"accepted\"],[\"x, b):\",\"target\"]]', 'stop', 12.0, NULL)")
    db.execute("INSERT INTO turn_stats VALUES (2, ?, '{\"k\": \"auto(3)\", \"temperature\": 0}')",
               ('{"tokens": 6, "drafted": 5, "accepted": 4, "target_calls": 2}',))
    db.commit()
    db.close()


def test_a_schema_3_history_opens_at_schema_4_and_loses_nothing(tmp_path):
    path = tmp_path / "history.sqlite3"
    schema_3_history(path)
    store = HistoryStore(path)
    assert store.schema_version == SCHEMA_VERSION == 4
    chats = store.list_chats()
    assert [(c.id, c.title, c.draft, c.target, c.created_at, c.updated_at, c.message_count,
             c.settings) for c in chats] == [
        (2, "Empty", "d2", "t2", 20.0, 20.0, 0, None),
        (1, "Fix add", "d", "t", 10.0, 13.0, 2, None)]
    user, reply = store.messages(1)
    assert (user.content, user.created_at, user.attachments) == (
        "rename a please", 11.0, (Attachment(**FILE),))
    assert reply.runs == [("def add(", TokenSource.ACCEPTED), ("x, b):", TokenSource.TARGET)]
    assert (reply.finish_reason, reply.stats.accepted, reply.meta) == (
        "stop", 4, {"k": "auto(3)", "temperature": 0})
    assert [hit.message_id for hit in store.search("rename")] == [1]
    # and the new column works on the old chats
    settings = ChatSettings.of(Config().with_preset("code"))
    store.set_chat_settings(1, settings)
    assert store.get_chat(1).settings == settings and store.get_chat(1).updated_at == 13.0
    store.close()
    reopened = HistoryStore(path)  # not migrated twice
    assert reopened.schema_version == 4 and reopened.get_chat(1).settings == settings
    assert len(reopened.messages(1)) == 2
    reopened.close()


def test_settings_round_trip_through_json_and_refuse_bad_values():
    config = Config(draft_length="5", temperature=0.25, max_tokens=99).with_preset("")
    settings = ChatSettings.of(config)
    data = settings.to_json()
    assert data["draft_length"] == 5 and data["preset"] == ""
    assert ChatSettings.from_json(json.loads(json.dumps(data))) == settings
    assert ChatSettings.from_json({"preset": "x", "later_setting": 1}).values == ()
    with pytest.raises(ValueError, match="top_p must be in"):
        ChatSettings.from_json({"top_p": 3})
    with pytest.raises(ValueError, match="'drafter' must be str"):
        ChatSettings.from_json({"drafter": 1})


@pytest.fixture
def chats(tmp_path):
    with SavedChats.at(tmp_path / "history.sqlite3") as saved:
        yield saved


def test_the_json_export_carries_the_settings_and_older_files_still_import(chats):
    code = Config().with_preset("code")
    chat_id = chats.start_chat("fix add", code)
    chats.store.add_message(chat_id, "user", "fix add")
    exported = chats.export(chat_id, "json")
    assert json.loads(exported)["settings"]["system_prompt"] == CODE_PROMPT
    copy = chats.import_json(exported)
    assert chats.get(copy).settings == ChatSettings.of(code)
    older = json.loads(exported)
    del older["settings"]  # a file written before chats kept their settings
    assert chats.get(chats.import_json(json.dumps(older))).settings is None
    older["settings"] = {"preset": "code", "temperature": -1}
    with pytest.raises(ChatFileError, match="settings.*temperature must be >= 0"):
        chats.import_json(json.dumps(older))


def test_a_chat_reopens_with_its_settings_and_a_note_when_its_preset_is_gone(chats):
    terse = Preset("terse", (("system_prompt", "Be terse."), ("temperature", 0.4)))
    started = Config(presets=(terse,)).with_preset("terse")
    chat_id = chats.start_chat("hello", started)
    now = Config(temperature=1.5, top_k=3)  # the config of a later start, without "terse"
    config, note = chats.reopened(chat_id, now)
    assert (config.preset, config.system_prompt, config.temperature, config.top_k) == (
        "terse", "Be terse.", 0.4, 0)
    assert "preset 'terse', which is no longer in the config file" in note
    config, note = chats.reopened(chat_id, now, {"temperature": 0.9})  # the command line's win
    assert config.temperature == 0.9 and config.system_prompt == "Be terse."
    chats.record_settings(chat_id, started, Config().with_preset("code"))
    config, note = chats.reopened(chat_id, now)
    assert (config.preset, config.system_prompt, note) == ("code", CODE_PROMPT, "")
    assert chats.reopened(None, now) == (now, "")  # a new chat: the settings in force
