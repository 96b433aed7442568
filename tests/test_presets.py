"""Presets in the config file: [presets.NAME] tables and ``preset = "NAME"``, their validation
(the file, the line, the preset and the fix named), their precedence (command line > preset > the
file's other values > defaults), --preset on the command line, and saving a config that has
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.cli import build_parser, load_settings, main
from chatapp.settings.config import Config, ConfigError, load_config
from chatapp.settings.config_file import save_config
from chatapp.settings.presets import BUILTIN_PRESETS, CODE_PROMPT, find_preset

MINE = """temperature = 0.9
top_k = 7
preset = "mine"

[presets.mine]
system = "Answer in French."
temperature = 0.3
k = 4
drafter = "ngram"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_the_built_in_presets_and_a_users_preset_over_the_files_values(tmp_path: Path) -> None:
    assert [p.name for p in Config().presets] == ["code", "chat"]
    code = Config().with_preset("code")
    assert (code.preset, code.temperature, code.draft_length, code.drafter, code.system_prompt) \
        == ("code", 0.0, "auto", "ngram+model", CODE_PROMPT)
    config = load_config(_write(tmp_path, MINE))
    assert config.preset == "mine" and [p.name for p in config.presets] == ["code", "chat", "mine"]
    # the preset wins over the file's values; what it leaves out keeps the file's
    assert (config.temperature, config.draft_length, config.drafter, config.top_k,
            config.system_prompt) == (0.3, "4", "ngram", 7, "Answer in French.")


def test_a_users_table_replaces_a_built_in_preset_of_its_name(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, '[presets.code]\nsystem = "Only Rust."\n'))
    assert find_preset(config.presets, "code").settings == {"system_prompt": "Only Rust."}
    assert config.preset == "" and config.system_prompt == ""  # chosen only by preset = "code"


@pytest.mark.parametrize(("text", "said"), [
    ("[presets.fast]\ntemprature = 0.1\n",
     r"line 1: preset 'fast' has an unknown key 'temprature'. Did you mean 'temperature'\? "
     r"A preset may set system, temperature, top_k, top_p, k, drafter."),
    ("x = 1\n\n[presets.fast]\ndrafter = \"ngrams\"\n",
     r"line 3: preset 'fast': drafter must be one of model, ngram, ngram\+model, got 'ngrams'."),
    ("[presets.fast]\ntemperature = \"hot\"\n",
     r"line 1: preset 'fast': 'temperature' must be float, got str 'hot'."),
    ("[presets.fast]\nk = 40\n", r"line 1: preset 'fast': k must be 0..16 or auto, got '40'."),
    ("seed = 1\npreset = \"cod\"\n",
     r"line 2: preset 'cod' is not defined. Did you mean 'code'\? Presets: code, chat; define "
     r"one as a \[presets.cod\] table in the config file."),
    ("presets = 3\n", r"line 1: 'presets' holds one table per preset: write \[presets.NAME\]"),
])
def test_a_bad_preset_names_the_file_the_line_the_preset_and_the_fix(tmp_path: Path, text: str,
                                                                      said: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^{path}, {said}"):
        load_config(path)


def test_a_bad_preset_is_one_line_on_stderr_not_a_traceback(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, "[presets.fast]\ndrafter = 3\n")
    assert main(["--config", str(path), "models"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "preset 'fast'" in err and "Traceback" not in err


def test_the_command_line_wins_over_the_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, MINE)
    args = build_parser().parse_args(["--config", str(path), "run", "--temperature", "0.5",
                                      "hi"])
    assert (load_settings(args).temperature, load_settings(args).draft_length) == (0.5, "4")
    args = build_parser().parse_args(["--config", str(path), "--preset", "code", "run", "-k", "2",
                                      "hi"])
    config = load_settings(args)
    assert (config.preset, config.system_prompt, config.draft_length, config.top_k) == (
        "code", CODE_PROMPT, "2", 0)  # code's top_k 0 over the file's 7
    args = build_parser().parse_args(["--config", str(path), "--preset", "nope", "run", "hi"])
    with pytest.raises(ConfigError, match="preset 'nope' is not defined.*Presets: code, chat, "
                                          "mine"):
        load_settings(args)


def test_saving_keeps_the_presets_tables_and_reads_back_the_same(tmp_path: Path) -> None:
    path = _write(tmp_path, MINE)
    config = load_config(path).with_preset("code")
    save_config(config, path)
    text = path.read_text()
    assert text.index('preset = "code"') < text.index("[presets.mine]")
    assert 'system = "Answer in French."' in text
    assert load_config(path) == config


def test_a_preset_whose_values_were_changed_is_saved_without_its_name(tmp_path: Path) -> None:
    # The file's preset goes over its other values: a value changed since cannot be kept under it.
    path = _write(tmp_path, MINE)
    config = load_config(path)
    changed = config.with_overrides(temperature=1.2)
    assert config.holds_preset and not changed.holds_preset
    save_config(changed, path)
    reloaded = load_config(path)
    assert reloaded.preset == "" and reloaded.temperature == 1.2
    assert reloaded.system_prompt == "Answer in French." and reloaded.presets == config.presets


def test_built_in_presets_are_valid_settings() -> None:
    for preset in BUILTIN_PRESETS:
        assert Config().with_preset(preset.name).holds_preset
