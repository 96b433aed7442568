"""The saved chats as front ends reach them (chatapp.chat.chats.SavedChats): a real history in a
temporary folder, no models."""

from __future__ import annotations

import sqlite3

import pytest

from chatapp.chat.chats import TITLE_LENGTH, ChatsError, NoSuchChat, SavedChats, chat_title
from chatapp.chat.history import HistoryStore
from chatapp.errors import UserFacingError


@pytest.fixture
def chats(tmp_path):
    saved = SavedChats()
    saved.open(tmp_path / "history.sqlite3")
    yield saved
    saved.close()


def test_rename_stores_a_clean_title_and_the_list_shows_it(chats):
    first = chats.store.create_chat("first", "d", "t", now=1.0)
    second = chats.store.create_chat("second", "d", "t", now=2.0)
    assert [c.id for c in chats.list_chats()] == [second, first] and chats.latest() == second
    assert chats.rename(first, "  Plans\tfor\x1b[31m May \n and more ") == (
        "Plans for␛[31m May and more")
    assert chats.get(first).title == "Plans for␛[31m May and more"
    assert chats.get(second).title == "second"
    assert chats.rename(first, "x" * 200) == "x" * TITLE_LENGTH
    assert chats.rename(first, "y" * (TITLE_LENGTH - 1) + " z") == "y" * (TITLE_LENGTH - 1)
    assert chat_title("a\r\nb") == "a b"


def test_rename_refuses_an_empty_title_and_a_deleted_chat(chats):
    chat = chats.store.create_chat("kept", "d", "t")
    with pytest.raises(ChatsError, match="needs a title"):
        chats.rename(chat, " \n ")
    assert chats.get(chat).title == "kept"
    chats.delete(chat)
    with pytest.raises(NoSuchChat, match=f"no chat {chat} in the history at"):
        chats.rename(chat, "too late")


def test_delete_tells_the_other_keeper_and_a_failed_write_is_an_error_to_show(tmp_path):
    forgotten: list[int] = []
    store = HistoryStore(tmp_path / "history.sqlite3")
    chats = SavedChats(store, on_delete=forgotten.append)
    chat = store.create_chat("gone soon", "d", "t")
    chats.delete(chat)
    assert not chats.exists(chat) and forgotten == [chat]
    other = store.create_chat("other", "d", "t")
    store._db.close()  # as if the disk went away
    with pytest.raises(ChatsError, match="Could not rename the chat in the history at"):
        chats.rename(other, "new")
    with pytest.raises(ChatsError, match="Could not delete the chat"):
        chats.delete(other)
    assert forgotten == [chat]


def test_a_failed_conversation_write_is_reported_and_returns_none(tmp_path):
    told: list[str] = []
    chats = SavedChats(HistoryStore(tmp_path / "history.sqlite3"), on_write_error=told.append)

    def broken(*args: object) -> int:
        raise sqlite3.OperationalError("disk I/O error")

    assert chats.write(broken, 1) is None
    assert len(told) == 1 and "disk I/O error" in told[0] and "goes on unsaved" in told[0]
    assert chats.write(lambda a, b=0: a + b, 1, b=2) == 3
    chats.close()


def test_export_writes_markdown_and_says_what_went_wrong(chats, tmp_path):
    chat = chats.store.create_chat("Export me", "d", "t")
    chats.store.add_message(chat, "user", "hello")
    path = chats.export_markdown(chat, tmp_path / "out")
    assert path.parent == tmp_path / "out" and "## You\n\nhello" in path.read_text()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ChatsError, match="Could not export the chat: .*can be written"):
        chats.export_markdown(chat, blocker / "out")
    with pytest.raises(UserFacingError, match=f"no chat {chat + 1}"):
        chats.export_markdown(chat + 1, tmp_path / "out")


def test_the_edit_backup_copies_the_chat_then_cuts_it(chats):
    chat = chats.store.create_chat("Story", "d", "t")
    chats.store.add_message(chat, "user", "once")
    cut = chats.store.add_message(chat, "assistant", "upon")
    chats.store.add_message(chat, "user", "a time")
    assert chats.keep_before_edit(chat, cut) == "Story (before edit)"
    backup = next(c for c in chats.list_chats() if c.title == "Story (before edit)")
    assert [m.content for m in chats.store.messages(backup.id)] == ["once", "upon", "a time"]
    assert [m.content for m in chats.store.messages(chat)] == ["once"]
    assert chats.keep_before_edit(chat, None) == "" and chats.keep_before_edit(None, cut) == ""


def test_without_a_history_nothing_is_listed_and_actions_say_why(tmp_path):
    chats = SavedChats()
    assert not chats.available and chats.list_chats() == [] and chats.latest() is None
    assert not chats.exists(1) and chats.keep_before_edit(1, 1) == ""
    for action in (lambda: chats.get(1), lambda: chats.rename(1, "t"), lambda: chats.delete(1),
                   lambda: chats.export_markdown(1, tmp_path)):
        with pytest.raises(ChatsError, match="history is not available"):
            action()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(UserFacingError, match="cannot be opened"):
        chats.open(blocker / "history.sqlite3")
    assert not chats.available
