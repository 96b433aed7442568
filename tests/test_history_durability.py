"""The history survives a second writer and a writer killed mid-stream."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from chatapp.chat.history import HistoryStore


def test_two_instances_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    chats: list[int] = []
    failures: list[BaseException] = []

    def write(title: str) -> None:
        """One app instance: its own connection to the same file."""
        try:
            store = HistoryStore(path)
            chat_id = store.create_chat(title)
            chats.append(chat_id)
            for i in range(60):
                store.add_message(chat_id, "user" if i % 2 == 0 else "assistant", f"message {i}")
            store.close()
        except BaseException as error:  # surfaced below: a thread cannot fail the test itself
            failures.append(error)

    threads = [threading.Thread(target=write, args=(title,)) for title in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(chats) == 2
    reopened = HistoryStore(path)
    for chat_id in chats:
        contents = [m.content for m in reopened.messages(chat_id)]
        assert contents == [f"message {i}" for i in range(60)]
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_writer_killed_mid_stream_keeps_every_finished_message(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    progress = tmp_path / "progress"
    # The count of finished writes is replaced atomically: a kill between truncating and writing
    # the file must not leave it empty.
    writer = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from chatapp.chat.history import HistoryStore
        store = HistoryStore(Path({str(path)!r}))
        chat = store.create_chat("killed")
        i = 0
        while True:
            store.add_message(chat, "user", "x" * 2000 + str(i))
            i += 1
            Path({str(progress)!r} + ".tmp").write_text(str(i))
            os.replace({str(progress)!r} + ".tmp", {str(progress)!r})
    """)
    process = subprocess.Popen([sys.executable, "-c", writer], cwd=Path(__file__).parent.parent)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and int(_read(progress) or 0) < 50:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished = int(_read(progress))
    assert finished >= 50
    store = HistoryStore(path)
    chat = store.list_chats()[0]
    contents = [m.content for m in store.messages(chat.id)]
    assert len(contents) >= finished  # every message whose write returned is there
    assert contents == ["x" * 2000 + str(i) for i in range(len(contents))]
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
