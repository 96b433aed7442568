"""Files attached to a message: read or refused with a clear message, sent to the models in a
fenced block, refused when they would not fit the context, saved with the message and shown
again in a reopened chat; `specchat run --file` attaches them."""

from __future__ import annotations

import json
import os
import signal

import pytest

import chatapp.assembly.loader
import chatapp.chat.attachments
from chatapp.bench import load_prompts, select_prompts
from chatapp.chat.attachments import (
    Attachment,
    AttachmentError,
    check_fits,
    language_of,
    message_text,
    read_attachment,
)
from chatapp.chat.chats import SavedChats
from chatapp.chat.conversation import Conversation
from chatapp.chat.history import HistoryStore
from chatapp.cli import main
from chatapp.settings.config import Config
from tests.conftest import tui_fake_factory

CONFIG = Config(draft_length="3", drafter="model", seed=0)
CODE = "def greet(name):\n    return 'hello ' + name\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The folder specchat was started in, with ``greet.py`` in it."""
    (tmp_path / "greet.py").write_text(CODE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_file_is_read_from_the_current_folder_or_home_with_its_language(folder, monkeypatch):
    assert read_attachment("greet.py") == Attachment("greet.py", "python", CODE)
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.md").write_text("# notes\n")
    assert read_attachment("notes.md", folder / "sub").language == "markdown"
    monkeypatch.setenv("HOME", str(folder))
    assert read_attachment("~/greet.py").text == CODE
    assert [language_of(name) for name in ("a.RS", "Makefile", "x/Dockerfile", "LICENSE",
                                           "data.unknown")] == ["rust", "makefile",
                                                                "dockerfile", "", ""]


def test_a_missing_path_a_folder_and_a_binary_file_are_refused_clearly(folder, monkeypatch):
    with pytest.raises(AttachmentError, match=f"There is no file {folder}/gone.py: check"):
        read_attachment("gone.py")
    with pytest.raises(AttachmentError, match="is a folder: attach the files in it"):
        read_attachment(str(folder))
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (folder / "latin1.txt").write_bytes("café".encode("latin-1"))
    (folder / "nul.txt").write_bytes(b"text\0more text")
    for name in ("image.png", "latin1.txt", "nul.txt"):
        with pytest.raises(AttachmentError, match=f"{name} is not a text file"):
            read_attachment(name)
    os.mkfifo(folder / "pipe")
    with pytest.raises(AttachmentError, match="not a regular file"):
        read_attachment("pipe")
    monkeypatch.setattr(chatapp.chat.attachments, "MAX_BYTES", 10)
    with pytest.raises(AttachmentError, match="more than any context window holds"):
        read_attachment("greet.py")


def test_a_path_swapped_for_a_fifo_after_the_checks_is_refused_not_waited_on(folder, monkeypatch):
    """Issue 35, item 13: the file is checked on the open file itself; a FIFO that took the
    place of a checked file used to block the reader (here: every path looks like a file)."""
    os.mkfifo(folder / "swapped")
    monkeypatch.setattr(type(folder), "is_file", lambda path: True)
    with pytest.raises(AttachmentError, match="not a regular file"):
        read_attachment("swapped")


def test_the_models_see_each_file_fenced_with_its_language_and_path_then_the_text():
    first = Attachment("a.py", "python", "x = 1")
    tricky = Attachment("doc.md", "markdown", "```python\ncode\n````\n")
    assert message_text("Add type hints", [first, tricky]) == (
        "```python a.py\nx = 1\n```\n\n"
        "`````markdown doc.md\n```python\ncode\n````\n`````\n\nAdd type hints")
    assert message_text("", [first]) == "```python a.py\nx = 1\n```"
    assert message_text("", [Attachment("notes", "", "a\n")]) == "```text notes\na\n```"
    assert message_text("just text", []) == "just text"


def test_a_file_that_does_not_fit_says_what_it_needs_and_what_is_left():
    def count(text: str) -> int:
        return len(text.split())

    small = Attachment("s.txt", "text", "one two")
    check_fits("hi", [small], count, room=6)  # "```text s.txt", the text, "```", "hi": 6 words
    with pytest.raises(AttachmentError, match=r"The file s.txt needs 5 tokens and 4 are left "
                                              r".*larger --n-ctx"):
        check_fits("hi there", [small], count, room=6)
    with pytest.raises(AttachmentError, match="The files s.txt, s.txt need 10 tokens and 0 "):
        check_fits("a b c d e f g", [small, small], count, room=6)
    check_fits("a b c d e f g", [], count, room=6)  # no file: nothing to refuse here


@pytest.fixture
def chat(tmp_path):
    history = HistoryStore(tmp_path / "history.sqlite3")
    conversation = Conversation(CONFIG, history)
    conversation.attach(tui_fake_factory(n_ctx=256)(CONFIG, lambda *_: None))
    yield conversation
    conversation.close()
    history.close()


def test_a_file_too_big_for_the_context_is_refused_and_nothing_is_saved(chat):
    session = chat.session
    big = Attachment("big.txt", "text", "spec ulative " * 200)
    with_file = session.message_tokens(message_text("summarise", [big]))
    needed = with_file - session.message_tokens("summarise")
    left = session.n_ctx - session.reply_room - session.message_tokens("summarise")
    assert needed > left > 0
    with pytest.raises(AttachmentError, match=f"needs {needed:,} tokens and {left:,} are left"):
        chat.begin("summarise", [big])
    assert chat.entries == [] and chat.chat_id is None and chat.history.list_chats() == []
    assert chat.turn is None


def test_an_attachment_is_sent_saved_and_shown_again_in_a_reopened_chat(chat, folder):
    attachment = read_attachment("greet.py")
    turn = chat.begin("Add type hints", [attachment])
    assert turn.messages[-1].content == message_text("Add type hints", [attachment])
    assert f"```python greet.py\n{CODE}```" in turn.messages[-1].content and turn.user_text == (
        "Add type hints")
    chat.run(turn)
    chat_id = chat.chat_id
    assert chat.history.get_chat(chat_id).title == "Add type hints"
    reopened = Conversation(CONFIG, chat.history)
    entries = reopened.open_chat(chat_id)
    assert entries[0].content == "Add type hints" and entries[0].attachments == (attachment,)
    assert reopened.messages[0].content == turn.messages[-1].content
    assert [hit.chat_id for hit in chat.history.search("type hints")] == [chat_id]
    with SavedChats.at(chat.history.path) as saved:
        assert f"```python greet.py\n{CODE}```\n\nAdd type hints" in saved.export(chat_id, "md")
        exported = saved.export(chat_id, "json")
        assert json.loads(exported)["messages"][0]["attachments"] == [attachment.to_json()]
        copy = saved.import_json(exported)
    assert chat.history.messages(copy)[0].attachments == (attachment,)


def test_an_edited_message_keeps_its_attachment(chat, folder):
    attachment = read_attachment("greet.py")
    first = chat.begin("Add type hints", [attachment])
    chat.run(first)
    turn, _ = chat.edit(chat.entries[0], "Add docstrings")
    assert turn.messages[-1].content == message_text("Add docstrings", [attachment])
    chat.run(turn)
    assert chat.history.messages(chat.chat_id)[0].attachments == (attachment,)


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    """`specchat run` loads fake models (no config file); returns the turns it began and the
    models it loaded."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    factory = tui_fake_factory(max_tokens=20, n_ctx=2048)
    loads: list[str] = []

    def build(config, progress, with_draft=True):
        loads.append(config.target)
        return factory(config, progress)

    monkeypatch.setattr(chatapp.assembly.loader, "build_session", build)
    begun = []
    begin = Conversation.begin
    monkeypatch.setattr(Conversation, "begin",
                        lambda self, *args: begun.append(begin(self, *args)) or begun[-1])
    handler = signal.getsignal(signal.SIGINT)
    yield begun, loads
    signal.signal(signal.SIGINT, handler)


def test_specchat_run_attaches_every_file_given(folder, fake_models, capsys):
    begun, _ = fake_models
    (folder / "two.txt").write_text("second file\n")
    assert main(["run", "--file", "greet.py", "--file", "two.txt", "Add type hints"]) == 0
    [turn] = begun
    assert turn.messages[-1].content == message_text(
        "Add type hints", [read_attachment("greet.py"), read_attachment("two.txt")])


CODE_EDITS = [p for p in load_prompts() if p.category == "code-edit"]


@pytest.mark.parametrize("prompt", CODE_EDITS, ids=[p.id for p in CODE_EDITS])
def test_the_bench_attaches_a_code_edits_code_as_specchat_run_file_does(folder, fake_models,
                                                                       prompt):
    """The code-edit-file variant of a bench prompt is the message `specchat run --file` sends
    with that prompt's code in a file and its instruction as the prompt."""
    begun, _ = fake_models
    instruction, code = prompt.text.split("\n\n```python\n")
    (folder / f"{prompt.id.replace('-', '_')}.py").write_text(code.removesuffix("```"))
    [variant] = select_prompts(CODE_EDITS, prompt.id + "-file")
    assert main(["run", "--file", f"{prompt.id.replace('-', '_')}.py",
                 instruction.removesuffix(":") + "."]) == 0
    [turn] = begun
    assert variant.category == "code-edit-file" and variant.text == turn.messages[-1].content


@pytest.mark.parametrize("name, reason", [("gone.py", "There is no file"),
                                          (".", "is a folder"), ("bin.dat", "not a text file"),
                                          ("big.txt", "needs")])
def test_specchat_run_refuses_a_file_in_one_line(folder, fake_models, capsys, name, reason):
    begun, loads = fake_models
    (folder / "bin.dat").write_bytes(b"\0\1\2")
    (folder / "big.txt").write_text("the spec " * 4000)
    assert main(["run", "--file", name, "Summarise"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("specchat: ") and reason in err and err.count("\n") == 1
    assert len(loads) == (name == "big.txt")  # a file is read before the models are loaded


def test_the_drafters_history_index_holds_past_chats_with_their_files(tmp_path):
    """The suffix index over the history renders a saved message as the models saw it, so a
    file attached in an earlier chat is a source for the drafter too."""
    from chatapp.assembly.loader import load_history_index
    from chatapp.backends.fake import FakeBackend
    from chatapp.chat.message import ChatMessage

    history = HistoryStore(tmp_path / "history.sqlite3")
    chat = history.create_chat("earlier")
    attachment = Attachment("notes.txt", "text", "the speculative draft token")
    history.add_message(chat, "user", "is the token", attachments=[attachment])
    target = FakeBackend()
    index = load_history_index(history, target, CONFIG)
    assert index.corpus.document(chat) == target.chat_prompt(
        [ChatMessage("user", message_text("is the token", [attachment]))])
    history.close()
