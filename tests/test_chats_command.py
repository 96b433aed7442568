"""`specchat chats`: list, search, export and import saved chats on the command line, through
``chatapp.chat.chats.SavedChats``; every mistake is one line and exit status 1."""

from __future__ import annotations

import json
import stat

import pytest

from chatapp.chat.chat_file import VERSION
from chatapp.chat.history import HistoryStore, default_history_path
from chatapp.cli import main
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats

STATS = TurnStats(tokens=7, prompt_tokens=20, drafted=6, accepted=4, target_calls=3,
                  per_position_accepted=(0.75, 0.5), total_s=0.7, prompt_s=0.1)
RUNS = [("def greet", TokenSource.ACCEPTED), ("(name: str)", TokenSource.RESAMPLED),
        (" -> str", TokenSource.BONUS)]


@pytest.fixture
def history(tmp_path, monkeypatch):
    """The user's history (``default_history_path``) in a folder of the test's own, with two
    chats: "Greeting" (a user message and a reply with provenance) and "Shopping"."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    store = HistoryStore(default_history_path())
    greeting = store.create_chat("Greeting", draft="small", target="big", now=100.0)
    store.add_message(greeting, "user", "Add type hints to greet", now=101.0)
    store.add_message(greeting, "assistant", "".join(text for text, _ in RUNS), runs=RUNS,
                      finish_reason="stop", stats=STATS, meta={"k": "auto 2–4", "top_p": 0.9},
                      now=102.0)
    shopping = store.create_chat("Shopping \x1b[31mlist", now=200.0)
    store.add_message(shopping, "user", "Buy apples and pears", now=201.0)
    store.ids = (greeting, shopping)
    yield store
    store.close()


def chats(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["chats", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(status: int, out: str, err: str) -> str:
    assert status == 1 and out == "" and err.startswith("specchat chats: ")
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_list_shows_every_chat_most_recent_first_printably(history, capsys):
    status, out, _ = chats(capsys, "list")
    header, first, second = out.splitlines()
    assert status == 0 and header.split() == ["ID", "LAST", "USED", "MSGS", "TITLE"]
    assert first.split()[0] == str(history.ids[1]) and first.endswith("Shopping ␛[31mlist")
    assert second.split()[0] == str(history.ids[0]) and second.endswith("  2  Greeting")


def test_search_finds_a_message_in_another_chat_and_says_when_nothing_matches(history, capsys):
    status, out, _ = chats(capsys, "search", "apples")
    message = history.messages(history.ids[1])[0].id
    assert status == 0 and out.splitlines() == [
        f"chat {history.ids[1]}, message {message} (you): Shopping ␛[31mlist",
        "    Buy apples and pears"]
    status, out, _ = chats(capsys, "search", "greet")
    assert status == 0 and out.count("chat ") == 2  # the question and the reply
    status, out, _ = chats(capsys, "search", "greet", "str")  # both words: only the reply
    assert status == 0 and out.splitlines()[1] == "    def greet(name: str) -> str"
    assert "no message matches 'bananas'" in one_line_error(*chats(capsys, "search", "bananas"))
    assert "at least one word" in one_line_error(*chats(capsys, "search", "--", "?!"))


def test_export_as_markdown_to_stdout_and_as_json_to_a_private_file(history, capsys, tmp_path):
    greeting = history.ids[0]
    status, out, _ = chats(capsys, "export", str(greeting))
    assert status == 0 and out.startswith("# Greeting\n") and "## Assistant\n\ndef greet" in out
    path = tmp_path / "greeting.json"
    status, out, err = chats(capsys, "export", str(greeting), "--format", "json", "-o", str(path))
    assert status == 0 and out == "" and str(path) in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["format"] == "specchat-chat" and data["version"] == VERSION
    assert data["messages"][1]["runs"] == [[text, source.value] for text, source in RUNS]


def test_an_exported_chat_imports_as_a_new_chat_with_everything_it_had(history, capsys, tmp_path):
    greeting = history.ids[0]
    path = tmp_path / "greeting.json"
    assert chats(capsys, "export", str(greeting), "--format", "json", "-o", str(path))[0] == 0
    status, out, _ = chats(capsys, "import", str(path))
    new = max(chat.id for chat in history.list_chats())
    assert status == 0 and out == f"Imported {path} as chat {new}: Greeting\n"
    old, copy = history.get_chat(greeting), history.get_chat(new)
    assert new not in history.ids
    assert (copy.title, copy.draft, copy.target, copy.created_at, copy.message_count) == (
        old.title, old.draft, old.target, old.created_at, old.message_count)
    fields = [(m.role, m.content, m.runs, m.finish_reason, m.stats, m.meta, m.created_at)
              for m in history.messages(greeting)]
    assert [(m.role, m.content, m.runs, m.finish_reason, m.stats, m.meta, m.created_at)
            for m in history.messages(new)] == fields
    assert {hit.chat_id for hit in history.search("greet")} == {greeting, new}


def test_an_unknown_chat_id_says_where_the_ids_are(history, capsys, tmp_path):
    for argv in (["export", "999"], ["rename", "999", "x"]):
        assert "`specchat chats list`" in one_line_error(*chats(capsys, *argv))


def test_rename_gives_a_chat_another_title(history, capsys):
    status, _, _ = chats(capsys, "rename", str(history.ids[1]), "Groceries")
    assert status == 0 and history.get_chat(history.ids[1]).title == "Groceries"


def valid_file(history) -> dict:
    from chatapp.chat.chats import SavedChats

    with SavedChats.at(history.path) as saved:
        return json.loads(saved.export(history.ids[0], "json"))


def broken(data: dict, change) -> str:
    change(data)
    return json.dumps(data)


MALFORMED = {
    "not JSON": (lambda data: "{ nope", "it is not JSON"),
    "a list": (lambda data: "[]", "not a specchat chat"),
    "another format": (lambda data: broken(data, lambda d: d.update(format="x")),
                       "not a specchat chat"),
    "a newer version": (lambda data: broken(data, lambda d: d.update(version=VERSION + 1)),
                        f"version {VERSION + 1} of the chat format and this specchat reads "
                        f"version {VERSION}: a newer specchat wrote it, upgrade"),
    "no messages": (lambda data: broken(data, lambda d: d.pop("messages")), 'no "messages"'),
    "a title number": (lambda data: broken(data, lambda d: d.update(title=3)),
                       '"title" of the wrong type'),
    "a bad role": (lambda data: broken(data, lambda d: d["messages"][0].update(role="robot")),
                   "message 1 has the role 'robot'"),
    "runs off content": (lambda data: broken(data, lambda d: d["messages"][1].update(
        content="other")), 'message 2 has "runs" whose text is not its "content"'),
    "a bad source": (lambda data: broken(data, lambda d: d["messages"][1].update(
        runs=[["def greet(name: str) -> str", "magic"]])), "source among accepted"),
    "bad stats": (lambda data: broken(data, lambda d: d["messages"][1]["stats"].update(
        tokens="7")), 'message 2 has "stats" that are not'),
    "a bad time": (lambda data: broken(data, lambda d: d["messages"][0].update(
        created_at=True)), 'message 1 has a "created_at" that is not a number'),
    "an infinite time": (lambda data: broken(data, lambda d: d.update(created_at=float("inf"))),
                         'the chat has a "created_at" that is not a number'),
    "a bad replay": (lambda data: broken(data, lambda d: d["messages"][1]["meta"].update(
        replay={"tokens": 3})), 'message 2 has a "meta" whose'),
    "bad attachments": (lambda data: broken(data, lambda d: d["messages"][0].update(
        attachments=[{"path": "a.py"}])), 'message 1 has "attachments" that are not'),
    "too deep": (lambda data: "[" * 100000 + "]" * 100000, "it is not JSON"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_file_is_refused_in_one_line_and_nothing_is_imported(history, capsys,
                                                                           tmp_path, case):
    make, reason = MALFORMED[case]
    path = tmp_path / "chat.json"
    path.write_text(make(valid_file(history)))
    before = history.list_chats()
    err = one_line_error(*chats(capsys, "import", str(path)))
    assert f"cannot import {path}: " in err and reason in err, err
    assert "specchat chats export ID --format json" in err
    assert history.list_chats() == before


def test_a_file_that_cannot_be_read_is_refused_in_one_line(history, capsys, tmp_path):
    assert "No such file" in one_line_error(*chats(capsys, "import", str(tmp_path / "gone")))
    assert "not a regular file" in one_line_error(*chats(capsys, "import", str(tmp_path)))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in one_line_error(*chats(capsys, "import", str(binary)))


def test_a_fifo_a_device_and_a_file_too_large_are_refused_at_once(history, capsys, tmp_path):
    """Issue 35, item 7: a FIFO used to hang the import, /dev/zero to exhaust memory."""
    import os

    fifo = tmp_path / "chat.fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in one_line_error(*chats(capsys, "import", str(fifo)))
    assert "not a regular file" in one_line_error(*chats(capsys, "import", "/dev/zero"))
    large = tmp_path / "large.json"
    with large.open("wb") as file:
        file.truncate(64 * 1024 * 1024 + 1)
    assert "over 64 MiB" in one_line_error(*chats(capsys, "import", str(large)))


def test_an_unreadable_history_is_one_line_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = default_history_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database" * 100)
    assert "cannot be opened" in one_line_error(*chats(capsys, "list"))


def test_a_search_on_a_damaged_index_is_one_line(history, capsys):
    """Issue 35, item 13: a damaged full-text index used to end `chats search` in a traceback."""
    import sqlite3

    db = sqlite3.connect(history.path)
    db.execute("DROP TABLE messages_fts_data")
    db.commit()
    db.close()
    assert "Could not search" in one_line_error(*chats(capsys, "search", "apples"))
