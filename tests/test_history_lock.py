"""The history while another process holds its write lock (issue 35, item 6): reading needs no
lock, a write that waited in vain says so, and a served reply is answered when it cannot be
saved."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chatapp.chat import history as history_module
from chatapp.chat.history import HistoryError, HistoryStore, default_history_path
from chatapp.cli import main
from tests.serve_launcher import ServeProcess
from tests.test_serve import post


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Another process's write transaction on the history at ``path``, held."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO chats (title, draft, target, created_at, updated_at) "
                  "VALUES ('other', '', '', 0, 0)")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_chats_are_listed_while_another_process_writes(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    store = HistoryStore(default_history_path())
    store.create_chat("Kept chat", now=100.0)
    store.close()
    with write_lock(default_history_path()):
        started = time.monotonic()
        status = main(["chats", "list"])
        took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert status == 0 and "Kept chat" in out, err
    assert took < 2.0


def test_a_write_that_waited_for_the_lock_in_vain_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    try:
        with write_lock(path), pytest.raises(HistoryError) as refused:
            store.create_chat("blocked")
        assert "being written by another specchat" in str(refused.value)
        assert "move the file away" not in str(refused.value)
    finally:
        store.close()


def test_a_served_reply_is_answered_when_the_history_cannot_save_it(tmp_path) -> None:
    server = ServeProcess(tmp_path, ["--save"])
    try:
        path = tmp_path / "data" / "specchat" / "history.sqlite3"
        with write_lock(path):
            status, answer = post(server, {"model": "specchat", "max_tokens": 3, "messages": [
                {"role": "user", "content": "the user asks"}]})
        assert status == 200, json.dumps(answer)
        assert answer["usage"]["completion_tokens"] == 3
        assert "not saved to the history" in answer["specchat"]["not_saved"]
    finally:
        assert server.stop() == 0
    assert b"not saved to the history" in server.stderr
