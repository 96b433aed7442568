"""Full-text search over the history (FTS5): kept in step with every write, built on opening a
history made before it existed, and safe with any text typed into it."""

from __future__ import annotations

import sqlite3

import pytest

from chatapp.chat.history import SCHEMA_VERSION, HistoryStore, match_query
from chatapp.chat.history_schema import MIGRATIONS
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats

STATS = TurnStats(tokens=5, drafted=4, accepted=3, target_calls=2, total_s=0.5)


@pytest.fixture
def store(tmp_path):
    history = HistoryStore(tmp_path / "history.sqlite3")
    yield history
    history.close()


def found(store: HistoryStore, text: str) -> list[int]:
    return [hit.message_id for hit in store.search(text)]


def indexed(store: HistoryStore) -> dict[str, int]:
    """What the FTS index itself holds: each term and how many messages it is in (a search
    joins the messages, so it would hide an entry left behind by a delete)."""
    store._db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab "
                      "USING fts5vocab(main, messages_fts, 'row')")
    return dict(store._db.execute("SELECT term, doc FROM temp.vocab").fetchall())


def test_a_search_finds_a_message_in_another_chat_with_its_chat_and_line(store):
    recipes = store.create_chat("Recipes")
    store.add_message(recipes, "user", "How long do I boil an egg?")
    code = store.create_chat("Refactoring")
    store.add_message(code, "user", "Rename the function parse_config")
    reply = store.add_message(code, "assistant", "Here it is.\n\nThe function load_settings "
                              "replaces parse_config everywhere.", runs=[], stats=STATS)
    [hit] = store.search("load_settings")
    assert (hit.chat_id, hit.message_id, hit.title, hit.role) == (code, reply, "Refactoring",
                                                                  "assistant")
    assert "\n" not in hit.snippet and "load_settings replaces parse_config" in hit.snippet
    assert found(store, "boil egg") == [store.messages(recipes)[0].id]
    assert found(store, "egg rename") == []  # every word must be in the message


def test_words_match_their_starts_case_and_accents_and_marks_go_around_them(store):
    chat = store.create_chat("Café")
    message = store.add_message(chat, "user", "Le café est CHAUD, speculative decoding")
    assert found(store, "cafe") == found(store, "CAF") == found(store, "specul") == [message]
    [hit] = store.search("chaud", mark=("<", ">"))
    assert "<CHAUD>" in hit.snippet


@pytest.mark.parametrize("text", ['"', "AND OR NOT", "a*b(c", "NEAR(x y)", "col: value", "-x ^y"])
def test_any_typed_text_is_searched_as_words_never_as_query_syntax(store, text):
    chat = store.create_chat("t")
    store.add_message(chat, "user", "x y value a b c AND OR NOT")
    store.search(text)  # no sqlite3.OperationalError


def test_text_without_a_word_finds_nothing():
    assert match_query("  -- !! ") == ""
    assert match_query('say "hi" OR bye*') == '"say"* "hi"* "OR"* "bye"*'


def test_the_index_follows_deletes_updates_and_chat_deletion(store):
    chat = store.create_chat("c")
    first = store.add_message(chat, "user", "alpha")
    second = store.add_message(chat, "assistant", "alpha beta", runs=[], stats=STATS)
    third = store.add_message(chat, "user", "alpha gamma")
    assert sorted(found(store, "alpha")) == [first, second, third]
    assert indexed(store) == {"alpha": 3, "beta": 1, "gamma": 1}
    store.delete_message(first)
    assert sorted(found(store, "alpha")) == [second, third] and indexed(store)["alpha"] == 2
    store._db.execute("UPDATE messages SET content = 'delta' WHERE id = ?", (second,))
    assert found(store, "beta") == [] and found(store, "delta") == [second]
    assert indexed(store) == {"alpha": 1, "delta": 1, "gamma": 1}
    store.delete_messages_from(third)
    assert indexed(store) == {"delta": 1}
    other = store.create_chat("other")
    kept = store.add_message(other, "user", "alpha again")
    store.delete_chat(chat)  # its messages go by cascade, and so do their index entries
    assert found(store, "alpha") == [kept] and indexed(store) == {"alpha": 1, "again": 1}


def test_copies_and_renames_are_searchable_under_their_title(store):
    chat = store.create_chat("first title")
    store.add_message(chat, "user", "unique words here")
    copy = store.copy_chat(chat, "the copy")
    store.rename_chat(chat, "renamed")
    assert sorted((hit.chat_id, hit.title) for hit in store.search("unique")) == [
        (chat, "renamed"), (copy, "the copy")]


def old_history(path) -> None:
    """A history as schema 1 (the release before search) wrote it."""
    db = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO chats VALUES (1, 'Old chat', 'd', 't', 10.0, 12.0)")
    db.execute("INSERT INTO messages VALUES (1, 1, 0, 'user', 'the quick brown fox', NULL, "
               "NULL, 11.0)")
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'jumps over the lazy dog', "
               "'[[\"jumps over the lazy dog\",\"accepted\"]]', 'stop', 12.0)")
    db.execute("INSERT INTO turn_stats VALUES (2, ?, '{\"k\": \"3\"}')",
               ('{"tokens": 6, "drafted": 5, "accepted": 4, "target_calls": 2}',))
    db.commit()
    db.close()


def test_a_history_from_before_search_gains_the_index_and_loses_nothing(tmp_path):
    path = tmp_path / "history.sqlite3"
    old_history(path)
    store = HistoryStore(path)
    assert store.schema_version == SCHEMA_VERSION
    [chat] = store.list_chats()
    assert (chat.id, chat.title, chat.draft, chat.target, chat.message_count) == (
        1, "Old chat", "d", "t", 2)
    user, reply = store.messages(1)
    assert (user.content, user.created_at) == ("the quick brown fox", 11.0)
    assert reply.runs == [("jumps over the lazy dog", TokenSource.ACCEPTED)]
    assert reply.stats.accepted == 4 and reply.meta == {"k": "3"}
    assert found(store, "fox") == [1] and found(store, "lazy dog") == [2]
    assert indexed(store)["the"] == 2
    store.add_message(1, "user", "a new fox")
    store.delete_message(1)
    assert len(found(store, "fox")) == 1 and indexed(store)["fox"] == 1
    store.close()
    reopened = HistoryStore(path)  # opened again: not migrated twice, the index as it was
    assert reopened.schema_version == SCHEMA_VERSION and len(found(reopened, "fox")) == 1
    reopened.close()


def test_a_chat_is_inserted_whole_or_not_at_all(store):
    chat = store.create_chat("source", draft="d", target="t", now=5.0)
    store.add_message(chat, "user", "hello", now=6.0)
    store.add_message(chat, "assistant", "hi", runs=[("hi", TokenSource.BONUS)],
                      finish_reason="stop", stats=STATS, meta={"k": "2"}, now=7.0)
    summary, messages = store.get_chat(chat), store.messages(chat)
    bad = messages + [messages[0].__class__(0, 0, "robot", "no", 8.0)]
    with pytest.raises(sqlite3.IntegrityError):
        store.insert_chat(summary, bad)
    assert [c.id for c in store.list_chats()] == [chat]
    new = store.insert_chat(summary, messages, now=9.0)
    copy = store.get_chat(new)
    assert (copy.title, copy.draft, copy.target, copy.created_at, copy.updated_at) == (
        "source", "d", "t", 5.0, 9.0)
    assert [(m.role, m.content, m.runs, m.stats, m.meta, m.created_at, m.finish_reason)
            for m in store.messages(new)] == [
        (m.role, m.content, m.runs, m.stats, m.meta, m.created_at, m.finish_reason)
        for m in messages]
