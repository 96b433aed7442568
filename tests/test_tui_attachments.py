"""Files into the prompt in the app: ``@path`` words, the file picker (ctrl+f), Tab completion
of paths, the chips, and each refusal (nothing sent, the typed text kept). Fake backends."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets import DirectoryTree

from chatapp.chat.mentions import complete_path, mentioned_paths, typed_fragment
from chatapp.tui.file_picker import FilePickerScreen
from chatapp.tui.keys import help_sections
from chatapp.tui.widgets import MessageView, Note
from tests.conftest import ADD_PY as CODE
from tests.conftest import keys, ready, reply_done, send, tui_fake_factory, wait_for

SIZE = (120, 40)


def views(app, role: str | None = None) -> list[MessageView]:
    return [v for v in app.query(MessageView) if role is None or v.role == role]


def chips(view: MessageView) -> list[str]:
    return [str(label.render()) for label in view.query(".attachment-chip")]


def error_notes(app) -> list[str]:
    return [note.render().plain for note in app.query(Note) if note.has_class("-error")]


def test_mentioned_paths_finds_the_words() -> None:
    assert mentioned_paths("explain @src/a.py please") == ["src/a.py"]
    assert mentioned_paths("@a.py fix it") == ["a.py"]
    assert mentioned_paths("see @a.py.") == ["a.py"]
    assert mentioned_paths('@"my notes.txt" and @a.py @a.py') == ["my notes.txt", "a.py"]
    assert mentioned_paths("mail me at a@b.com") == []
    assert mentioned_paths("```\n@dataclass\nclass A: ...\n```\n@a.py") == ["a.py"]
    assert mentioned_paths("x\n    indented @a.py\n    kept") == ["a.py"]
    assert typed_fragment("look at @sr") == "sr" and typed_fragment("a@b") is None


def test_complete_path_extends_to_the_common_prefix(folder: Path) -> None:
    (folder / "alpha.py").write_text("a")
    (folder / "alps.txt").write_text("b")
    (folder / ".alien").write_text("hidden")
    assert complete_path("s", folder) == ("src/", ["src/"])
    assert complete_path("src/a", folder) == ("src/add.py", ["add.py"])
    assert complete_path("al", folder) == ("alp", ["alpha.py", "alps.txt"])
    assert complete_path(".al", folder) == (".alien", [".alien"])
    assert complete_path("nothing", folder) == ("nothing", [])
    assert complete_path(f"{folder}/sr", Path("/")) == (f"{folder}/src/", ["src/"])


async def test_an_at_path_attaches_the_file_and_a_reopened_chat_shows_its_chip(
        tui_make_app, folder):
    app = tui_make_app(folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "rename a to x in @src/add.py please")
        await reply_done(pilot)
        user = views(app, "user")[0]
        assert user.plain == "rename a to x in @src/add.py please"  # the sentence as asked
        assert chips(user) == ["📎 src/add.py (2 lines)"]
        entry = app.chat.entries[0]
        assert [(a.path, a.language, a.text) for a in entry.attachments] == [
            ("src/add.py", "python", CODE)]
        sent = app.chat.messages[0].content  # what the models see
        assert "```python src/add.py\n" + CODE + "```" in sent
        assert app.chat_input.text == ""
    reopened = tui_make_app(folder=folder)
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert chips(views(reopened, "user")[0]) == ["📎 src/add.py (2 lines)"]


@pytest.mark.parametrize(("make", "typed", "said"), [
    (lambda folder: None, "fix @missing.py", "There is no file"),
    (lambda folder: None, "look at @src", "is a folder"),
    (lambda folder: (folder / "blob.bin").write_bytes(b"\x00\x01\x02"), "@blob.bin what",
     "is not a text file"),
    (lambda folder: (folder / "big.txt").write_text("word " * 4000), "sum up @big.txt",
     "tokens and"),
])
async def test_a_file_that_cannot_be_attached_is_refused_and_the_text_kept(
        tui_make_app, folder, make, typed, said):
    make(folder)
    app = tui_make_app(tui_fake_factory(n_ctx=512), folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, typed)
        await pilot.pause()
        assert app.chat.turn is None and views(app) == []
        assert app.chat_input.text == typed
        assert any(said in note for note in error_notes(app)), error_notes(app)
        assert app.chat.chat_id is None and app.chat.chats.list_chats() == []


async def test_a_message_sent_while_loading_keeps_its_file(tui_make_app, folder):
    gate = threading.Event()
    app = tui_make_app(tui_fake_factory(gate=gate), folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await send(pilot, "@src/add.py explain")
        queued = views(app, "user")[0]
        assert queued.has_class("-queued") and chips(queued) == ["📎 src/add.py (2 lines)"]
        (folder / "src" / "add.py").write_text(CODE + "# edited\n")
        gate.set()
        await ready(pilot)
        await reply_done(pilot)
        (attachment,) = app.chat.entries[0].attachments
        assert attachment.text.endswith("# edited\n")  # read when it was sent
        assert app.chat.entries[0].content == "@src/add.py explain"


async def test_a_queued_message_whose_file_went_away_comes_back_to_the_box(tui_make_app,
                                                                           folder):
    gate = threading.Event()
    app = tui_make_app(tui_fake_factory(gate=gate), folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await send(pilot, "@src/add.py explain")
        (folder / "src" / "add.py").unlink()
        gate.set()
        await ready(pilot)
        await pilot.pause()
        assert views(app) == [] and app.chat.turn is None
        assert app.chat_input.text == "@src/add.py explain"
        assert any("There is no file" in note for note in error_notes(app))


async def test_ctrl_f_picks_a_file_and_puts_its_at_path_at_the_cursor(tui_make_app, folder):
    app = tui_make_app(folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.chat_input.text = "explain"
        app.chat_input.move_cursor(app.chat_input.document.end)
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert isinstance(app.screen, FilePickerScreen)
        tree = app.screen.query_one(DirectoryTree)
        await wait_for(pilot, lambda: len(tree.root.children) == 1, what="the tree")
        await pilot.press("down", "enter")  # open src/
        await wait_for(pilot, lambda: tree.root.children[0].children, what="src's files")
        await pilot.press("down", "enter")  # src/add.py
        await pilot.pause()
        assert not isinstance(app.screen, FilePickerScreen)
        assert app.chat_input.text == "explain @src/add.py "
        assert app.chat_input.has_focus
        await pilot.press("ctrl+f")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.chat_input.text == "explain @src/add.py "


async def test_tab_after_an_at_word_completes_the_path(tui_make_app, folder):
    (folder / "src" / "addition.md").write_text("# notes\n")
    app = tui_make_app(folder=folder)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"see @s", "tab")
        assert app.chat_input.text == "see @src/"
        await pilot.press("a", "tab")
        assert app.chat_input.text == "see @src/add"
        await pilot.press("tab")  # two matches: listed, the text unchanged
        await pilot.pause()
        assert any("add.py" in n.message and "addition.md" in n.message
                   for n in app._notifications)
        await pilot.press(".", "p", "tab")
        assert app.chat_input.text == "see @src/add.py" and app.chat_input.has_focus
        await pilot.press("space", "tab")  # not after an @ word: Tab goes to the messages
        assert not app.chat_input.has_focus
        await keys(pilot, "enter")


async def test_the_new_keys_are_in_the_help_and_the_palette(tui_make_app):
    sections = dict(help_sections())
    anywhere = dict(sections["Anywhere in the chat"])
    assert "Attach a file" in anywhere["ctrl+f"]
    box = dict(sections["Message box"])
    assert "Attach that file" in box["@path"] and "Complete the path" in box["Tab after @…"]
    chat_list = dict(sections["Chat list (ctrl+o)"])
    assert "Search every chat" in chat_list["/"] and "Clear the search" in chat_list["Esc"]
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert "Attach file" in titles
