"""Config file errors name the file, the line and the key; CLI flags override the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.cli import build_parser, load_settings, main
from chatapp.config import Config, ConfigError, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path / "none.toml") == Config()


def test_values_are_read(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, 'temperature = 1\ndraft_length = 5\ntarget = "x"\n'))
    assert config.temperature == 1.0 and config.fixed_draft_length == 5 and config.target == "x"
    assert load_config(_write(tmp_path, 'draft_length = "auto"\n')).fixed_draft_length is None


def test_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, 'temperature = 0.5\ntop_p = = 3\n')
    with pytest.raises(ConfigError, match=r"config\.toml.*line 2"):
        load_config(path)


def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 3: unknown setting 'temprature'.*'temperature'"):
        load_config(_write(tmp_path, 'seed = 1\n\ntemprature = 0.3\n'))


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 2: 'top_k' must be int, got str"):
        load_config(_write(tmp_path, 'seed = 1\ntop_k = "ten"\n'))


@pytest.mark.parametrize("text, key", [("top_p = 1.5", "top_p"), ("temperature = -1", "temperature"),
                                       ('draft_length = 99', "draft_length"),
                                       ('backend = "gpu"', "backend")])
def test_out_of_range_values_name_the_key_and_line(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"line 2: {key}"):
        load_config(_write(tmp_path, f"seed = 3\n{text}\n"))


def test_cli_flags_override_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 'temperature = 0.9\ntop_k = 5\n')
    args = build_parser().parse_args(["--config", str(path), "run", "-k", "2", "--temperature", "0",
                                      "hi"])
    config = load_settings(args)
    assert config.temperature == 0.0 and config.top_k == 5 and config.draft_length == "2"


def test_flags_before_the_subcommand_count_too(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--config", str(tmp_path / "x.toml"), "--top-p", "0.5",
                                      "run", "hi"])
    assert load_settings(args).top_p == 0.5


@pytest.mark.parametrize("argv", [["run", "-k", "-1", "x"], ["run", "--temperature", "-0.5", "x"],
                                  ["run", "--top-p", "0", "x"], ["run", "--top-p", "1.01", "x"],
                                  ["run", "-k", "17", "x"]])
def test_out_of_range_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_a_broken_config_is_one_line_not_a_traceback(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path, "top_k = [\n")
    assert main(["--config", str(path), "models"]) == 1
    err = capsys.readouterr().err
    assert "config.toml" in err and "Traceback" not in err
