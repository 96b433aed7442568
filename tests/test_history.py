"""The chat history store: schema, permissions, round trips, export."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from chatapp.chat.history import (
    SCHEMA_VERSION,
    HistoryError,
    HistoryStore,
    decode_runs,
    encode_runs,
)
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats

STATS = TurnStats(tokens=12, prompt_tokens=30, drafted=15, accepted=9, target_calls=5,
                  per_position_accepted=(0.8, 0.6, 0.4), draft_s=0.1, verify_s=0.3,
                  prompt_s=0.05, total_s=0.5, ttft_s=0.07)
RUNS = [("Hel", TokenSource.ACCEPTED), ("lo", TokenSource.ACCEPTED), (",", TokenSource.RESAMPLED),
        (" wor", TokenSource.BONUS), ("", TokenSource.TARGET), ("ld", TokenSource.TARGET)]


@pytest.fixture
def store(tmp_path):
    history = HistoryStore(tmp_path / "specchat" / "history.sqlite3")
    yield history
    history.close()


def test_new_database_is_private_versioned_and_in_wal_mode(store, tmp_path):
    folder = tmp_path / "specchat"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.schema_version == SCHEMA_VERSION
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.create_chat("x")
    wal = store.path.with_name(store.path.name + "-wal")
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path):
    path = tmp_path / "h.sqlite3"
    first = HistoryStore(path)
    chat = first.create_chat("kept")
    first.close()
    second = HistoryStore(path)
    assert second.schema_version == SCHEMA_VERSION
    assert [c.title for c in second.list_chats()] == ["kept"]
    assert second.get_chat(chat).title == "kept"
    second.close()


def test_a_database_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(HistoryError, match="newer specchat"):
        HistoryStore(path)


def test_an_unreadable_database_gives_a_readable_error(tmp_path):
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(HistoryError, match="cannot be opened"):
        HistoryStore(path)


def test_runs_are_merged_and_round_trip():
    encoded = encode_runs(RUNS)
    assert encoded == '[["Hello","accepted"],[",","resampled"],[" wor","bonus"],["ld","target"]]'
    assert decode_runs(encoded) == [("Hello", TokenSource.ACCEPTED), (",", TokenSource.RESAMPLED),
                                    (" wor", TokenSource.BONUS), ("ld", TokenSource.TARGET)]
    assert decode_runs(None) is None


def test_messages_runs_and_stats_round_trip(store):
    chat = store.create_chat("greeting", draft="small", target="big", now=100.0)
    user = store.add_message(chat, "user", "Say hello", now=101.0)
    reply = store.add_message(chat, "assistant", "Hello, world", runs=RUNS, finish_reason="stop",
                              stats=STATS, meta={"k": "3", "temperature": 0.0}, now=102.0)
    messages = store.messages(chat)
    assert [m.id for m in messages] == [user, reply]
    assert messages[0].role == "user" and messages[0].stats is None and messages[0].runs is None
    assert messages[1].content == "Hello, world"
    assert "".join(text for text, _ in messages[1].runs) == "Hello, world"
    assert messages[1].finish_reason == "stop"
    assert messages[1].stats == STATS
    assert messages[1].meta == {"k": "3", "temperature": 0.0}
    summary = store.list_chats()[0]
    assert (summary.title, summary.draft, summary.target, summary.message_count) == (
        "greeting", "small", "big", 2)
    assert summary.updated_at == 102.0


def test_chats_are_listed_most_recent_first_and_deleted_with_their_messages(store):
    old = store.create_chat("old", now=1.0)
    new = store.create_chat("new", now=2.0)
    store.add_message(old, "user", "bump", now=3.0)
    assert [c.id for c in store.list_chats()] == [old, new]
    reply = store.add_message(old, "assistant", "x", runs=[], stats=STATS)
    store.delete_chat(old)
    assert [c.id for c in store.list_chats()] == [new]
    assert store.messages(old) == []
    assert store._db.execute("SELECT COUNT(*) FROM turn_stats WHERE message_id = ?",
                             (reply,)).fetchone()[0] == 0


def test_a_failed_write_leaves_nothing_behind(store):
    chat = store.create_chat("c")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(chat, "robot", "not a role")
    assert store.messages(chat) == []


def test_export_to_markdown(store, tmp_path):
    chat = store.create_chat("What is speculative decoding?", draft="d", target="t")
    store.add_message(chat, "user", "What is speculative decoding?")
    store.add_message(chat, "assistant", "A draft proposes.", runs=RUNS, finish_reason="cancelled",
                      stats=STATS, meta={"k": "3"})
    path = store.export_markdown(chat, tmp_path / "out")
    assert path == tmp_path / "out" / f"specchat-{chat}-what-is-speculative-decoding.md"
    text = path.read_text()
    assert text.startswith("# What is speculative decoding?\n")
    assert "## You\n\nWhat is speculative decoding?" in text
    assert "## Assistant (stopped)\n\nA draft proposes." in text
    assert "> 12 tokens · 24.0 tok/s · K 3 · acceptance 60% · 2.40 tokens per target call" in text
    assert path.stat().st_mode & 0o777 == 0o600  # a conversation stays private once exported
    path.chmod(0o644)
    assert store.export_markdown(chat, tmp_path / "out").stat().st_mode & 0o777 == 0o600
    with pytest.raises(HistoryError):
        store.export_markdown(chat + 100, tmp_path)


def test_the_markdown_heading_says_how_each_reply_ended(store, tmp_path):
    chat = store.create_chat("c")
    for reason in ("stop", "length", "cancelled", "error", None):
        store.add_message(chat, "assistant", f"ended by {reason}", finish_reason=reason)
    text = store.export_markdown(chat, tmp_path).read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Assistant", "## Assistant (cut at max tokens)",
                        "## Assistant (stopped)", "## Assistant (failed)", "## Assistant"]


def test_a_regenerated_reply_replaces_the_old_one_in_one_transaction(tmp_path) -> None:
    """Issue 35, item 6: the old reply was deleted, then the new one inserted, in two
    transactions; a failed insert now leaves the old reply in place."""
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat = store.create_chat("c")
    store.add_message(chat, "user", "hi")
    old = store.add_message(chat, "assistant", "first")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(chat + 1, "assistant", "second", replacing=old)  # no such chat
    assert [m.content for m in store.messages(chat)] == ["hi", "first"]
    new = store.add_message(chat, "assistant", "second", replacing=old)
    assert [(m.id, m.content) for m in store.messages(chat)] == [
        (store.messages(chat)[0].id, "hi"), (new, "second")]
    store.close()
