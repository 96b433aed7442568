"""The settings screen's "Save as defaults": applies the settings and writes them to the config
file (Pilot on fake backends), so that the next start picks them up."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from textual.widgets import Input, TextArea

from chatapp.cli import build_parser, load_settings
from chatapp.settings.config import load_config
from chatapp.tui.screens import SettingsScreen
from tests.conftest import open_settings, ready

SIZE = (120, 40)
PROMPT = 'Be "brief".\nUse C:\\paths — ünïcode too.'


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _type_changes(screen: SettingsScreen) -> None:
    screen.query_one("#set-temperature", Input).value = "0.7"
    screen.query_one("#set-system_prompt", TextArea).text = PROMPT


def _notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_save_as_defaults_writes_a_new_file_that_the_next_start_reads(tui_make_app,
                                                                            tmp_path):
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "home" / "specchat" / "config.toml"  # neither directory exists yet
    app = tui_make_app(config_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        _type_changes(screen)
        screen.query_one("#set-system_prompt", TextArea).focus()  # F8 works from the text box
        await pilot.press("f8")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert f"Saved to {path}" in _notes(app)
        # Applied now, as Save does ...
        assert app.config.temperature == 0.7 and app.config.system_prompt == PROMPT
        assert app.chat.session.settings.sampling.temperature == 0.7
        assert app.chat.session.system_prompt == PROMPT
        saved = app.config
    # ... and written: 0600 in new 0700 directories, the parent that existed left alone.
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700 and _mode(path.parent.parent) == 0o700
    assert _mode(tmp_path) == 0o755
    text = path.read_text(encoding="utf-8")
    assert "temperature = 0.7\n" in text
    assert 'system_prompt = "Be \\"brief\\".\\nUse C:\\\\paths — ünïcode too."\n' in text
    assert "top_p" not in text  # defaults are not written
    assert load_config(path) == saved
    # The next start (the CLI reads the file given by --config) has them.
    restarted = load_settings(build_parser().parse_args(["--config", str(path), "run", "hi"]))
    assert restarted == saved
    second = tui_make_app(config=restarted, config_path=path)
    async with second.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert second.chat.session.settings.sampling.temperature == 0.7
        screen = await open_settings(pilot)
        assert screen.query_one("#set-temperature", Input).value == "0.7"
        assert screen.query_one("#set-system_prompt", TextArea).text == PROMPT


async def test_save_as_defaults_keeps_a_hand_edited_files_comments(tui_make_app, tmp_path):
    directory = tmp_path / "mine"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    path = directory / "config.toml"
    path.write_text("# my settings, by hand\n"
                    "temperature = 0.1  # a little warmth\n"
                    "\n"
                    "top_k = 40  # keep\n"
                    "# seed = 42\n")
    os.chmod(path, 0o644)
    app = tui_make_app(config=load_config(path), config_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        _type_changes(screen)
        await pilot.click("#settings-save-defaults")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert f"Saved to {path}" in _notes(app)
    assert path.read_text(encoding="utf-8") == (
        "# my settings, by hand\n"
        "temperature = 0.7  # a little warmth\n"
        "\n"
        "top_k = 40  # keep\n"
        "# seed = 42\n"
        'system_prompt = "Be \\"brief\\".\\nUse C:\\\\paths — ünïcode too."\n')
    assert _mode(path) == 0o600 and _mode(directory) == 0o755
    assert load_config(path).system_prompt == PROMPT


@pytest.mark.parametrize("how", ["parent is a file", "disk full"])
async def test_a_failed_save_is_shown_in_the_dialog_which_stays_open(tui_make_app, tmp_path,
                                                                     monkeypatch, how):
    if how == "parent is a file":
        (tmp_path / "afile").write_text("")
        path = tmp_path / "afile" / "config.toml"
        reason = "Not a directory"
    else:
        path = tmp_path / "config.toml"
        path.write_text("# mine\ntop_k = 1\n")
        reason = "No space left on device"

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, reason)

        monkeypatch.setattr(os, "fsync", full)
    app = tui_make_app(config_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        before = app.config
        screen = await open_settings(pilot)
        _type_changes(screen)
        await pilot.press("alt+s")
        await pilot.pause()
        assert app.screen is screen  # still open ...
        error = str(screen.query_one("#settings-error").render())
        assert str(path) in error and reason in error
        assert screen.query_one("#set-temperature", Input).value == "0.7"  # ... with the input
        assert screen.query_one("#set-system_prompt", TextArea).text == PROMPT
        assert app.config == before  # and nothing applied
        assert not any(note.startswith("Saved to") for note in _notes(app))
        monkeypatch.undo()
        # Save (not as defaults) still works from there.
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.config.temperature == 0.7
    if how == "disk full":
        assert path.read_text() == "# mine\ntop_k = 1\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".config")] == []


async def test_an_invalid_value_is_not_saved(tui_make_app, tmp_path):
    path = tmp_path / "config.toml"
    app = tui_make_app(config_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        screen.query_one("#set-top_p", Input).value = "2"
        await pilot.press("f8")
        await pilot.pause()
        assert app.screen is screen
        assert "top_p" in str(screen.query_one("#settings-error").render())
    assert not path.exists()


def test_saving_beside_a_long_multi_line_system_prompt_takes_one_pass(tmp_path) -> None:
    """Issue 35, item 9: the statement's end used to be found by parsing the file again at every
    line break and '#' of its value (quadratic in a long system prompt)."""
    import time

    from chatapp.settings.config import Config, load_config
    from chatapp.settings.config_file import save_config

    prompt = "\n".join(f"# rule {n}: keep it short # and 'quoted' \"too\"" for n in range(4000))
    path = tmp_path / "config.toml"
    path.write_text(f'system_prompt = """\n{prompt}"""\n# mine\ntemperature = 0.5\n')
    started = time.perf_counter()
    save_config(Config(system_prompt=prompt, temperature=0.9), path)
    assert time.perf_counter() - started < 2.0
    assert load_config(path) == Config(system_prompt=prompt, temperature=0.9)
    assert "# mine" in path.read_text()
