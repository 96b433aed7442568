"""Chats saved before the finish reason and K were values still open as they were written.

tests/data/history_015be51.sqlite3 is a history written by specchat at commit 015be51 (schema
version 4): a chat whose replies ended "stop" with K "auto 2–5", "cancelled" with K "3→5" (the
user changed K while it streamed) and "error" with K "3"."""

from __future__ import annotations

import shutil
from pathlib import Path

from chatapp.chat.conversation import Conversation
from chatapp.chat.history import HistoryStore, chat_markdown
from chatapp.chat.reply_values import Ending
from chatapp.settings.config import Config
from tests.conftest import tui_fake_factory

SAVED = Path(__file__).resolve().parent / "data" / "history_015be51.sqlite3"
CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.0)


def test_a_chat_saved_before_opens_with_its_endings_and_k_labels(tmp_path: Path) -> None:
    shutil.copy(SAVED, tmp_path / "history.sqlite3")
    history = HistoryStore(tmp_path / "history.sqlite3")
    chat = Conversation(CONFIG, history)
    [summary] = chat.chats.list_chats()
    entries = chat.open_chat(summary.id)
    replies = [entry for entry in entries if entry.role == "assistant"]
    assert [(entry.finish_reason, entry.k_label) for entry in replies] == [
        (Ending.STOP, "auto 2–5"), (Ending.CANCELLED, "3→5"), (Ending.ERROR, "3")]
    assert "K auto 2–5" in chat_markdown(summary, history.messages(summary.id))

    chat.attach(tui_fake_factory()(CONFIG, lambda *_: None))
    chat.run(chat.begin("and now?"))  # a reply of today in the same chat
    stored = history.messages(summary.id)[-1]
    assert stored.meta["k"] == {"mode": "fixed", "start": 3, "ks": [3]}
    assert chat.open_chat(summary.id)[-1].k_label == "3"
    chat.close()
    history.close()
