"""Config file errors name the file, the line and the key; CLI flags override the file; save_config
writes a file that loads back the same, keeping a hand-edited file's comments."""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatapp.cli import build_parser, load_settings, main
from chatapp.settings.config import Config, ConfigError, load_config
from chatapp.settings.config_file import save_config


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


@pytest.mark.parametrize("text, key", [("top_p = 1.5", "top_p"),
                                       ("temperature = -1", "temperature"),
                                       ('draft_length = 99', "draft_length"),
                                       ('backend = "gpu"', "backend"),
                                       ('draft_backend = "onnx"', "draft_backend"),
                                       ('overflow = "drop-newest"', "overflow")])
def test_out_of_range_values_name_the_key_and_line(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"line 2: {key}"):
        load_config(_write(tmp_path, f"seed = 3\n{text}\n"))


def test_cli_flags_override_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 'temperature = 0.9\ntop_k = 5\n')
    args = build_parser().parse_args(["--config", str(path), "run", "-k", "2", "--temperature", "0",
                                      "hi"])
    config = load_settings(args)
    assert config.temperature == 0.0 and config.top_k == 5 and config.draft_length == "2"


def test_the_overflow_policy_is_read_from_the_file_and_the_flag(tmp_path: Path) -> None:
    assert Config().overflow == "drop-oldest"
    path = _write(tmp_path, 'overflow = "refuse"\n')
    assert load_settings(build_parser().parse_args(["--config", str(path), "run", "x"])
                         ).overflow == "refuse"
    args = build_parser().parse_args(["--config", str(path), "--overflow", "drop-oldest", "tui"])
    assert load_settings(args).overflow == "drop-oldest"
    with pytest.raises(ConfigError, match=r"line 1: unknown setting 'overflw'.*'overflow'"):
        load_config(_write(tmp_path, 'overflw = "refuse"\n'))
    with pytest.raises(ConfigError, match=r"line 1: overflow must be drop-oldest or refuse, "
                                          r"got 'drop'"):
        load_config(_write(tmp_path, 'overflow = "drop"\n'))


def test_flags_before_the_subcommand_count_too(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--config", str(tmp_path / "x.toml"), "--top-p", "0.5",
                                      "run", "hi"])
    assert load_settings(args).top_p == 0.5


@pytest.mark.parametrize("argv", [["run", "-k", "-1", "x"], ["run", "--temperature", "-0.5", "x"],
                                  ["run", "--top-p", "0", "x"], ["run", "--top-p", "1.01", "x"],
                                  ["run", "-k", "17", "x"], ["run", "--overflow", "cut", "x"]])
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


# -- save_config: what the settings screen's "Save as defaults" writes ---------------------------

TRICKY_PROMPTS = ["", 'He said "hi"', "back\\slash \\n not a newline", "two\nlines\n",
                  "tab\tand\r\nCRLF", "unicode: ü ñ 漢字 🙂", '"""triple"""', "'''single'''",
                  "# not a comment", "temperature = 9\nseed = 1", "ctrl \x00\x01\x1f\x7f end",
                  "\\", '"', "\\\"", "trailing backslash \\"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("prompt", TRICKY_PROMPTS)
@pytest.mark.parametrize("seed, draft_length", [(None, "auto"), (0, "0"), (42, "16"), (None, "3")])
def test_save_then_load_gives_the_same_config(tmp_path: Path, prompt: str, seed: int | None,
                                              draft_length: str) -> None:
    config = Config(system_prompt=prompt, seed=seed, draft_length=draft_length, temperature=0.7)
    path = tmp_path / "config.toml"
    assert save_config(config, path) == path
    assert load_config(path) == config


configs = st.builds(
    Config,
    draft=st.text(), target=st.text(),
    backend=st.sampled_from(["llama", "hf"]),
    drafter=st.sampled_from(["model", "ngram", "ngram+model"]),
    draft_length=st.sampled_from(["auto"] + [str(k) for k in range(17)]),
    temperature=st.floats(min_value=0, allow_nan=False),
    top_k=st.integers(0, 2**31), top_p=st.floats(min_value=0, max_value=1, exclude_min=True),
    seed=st.none() | st.integers(0, 2**63 - 1), max_tokens=st.integers(1, 2**31),
    system_prompt=st.text(), n_ctx=st.integers(64, 2**31),
    threads=st.none() | st.integers(1, 512), gpu_layers=st.integers(-1, 999),
    device=st.sampled_from(["auto", "cpu", "cuda", "cuda:1"]),
    dtype=st.sampled_from(["auto", "float32", "bfloat16", "float16"]),
    overflow=st.sampled_from(["drop-oldest", "refuse"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=configs, second=configs)
def test_any_config_round_trips_also_over_a_file_saved_before(first: Config,
                                                              second: Config) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.toml"
        save_config(first, path)
        assert load_config(path) == first
        save_config(second, path)  # an update in place of the first file
        assert load_config(path) == second


def test_a_new_file_holds_only_what_differs_from_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    save_config(Config(), path)
    assert [line for line in path.read_text().splitlines() if not line.startswith("#")] == []
    save_config(Config(temperature=0.5, system_prompt='say "hi"\n', drafter="model"), path)
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert lines == ['drafter = "model"', "temperature = 0.5",
                     'system_prompt = "say \\"hi\\"\\n"']


HAND_EDITED = """\
# my specchat settings
temperature = 0.2   # a little warmth
top_k = 40

# the prompt, with a '#' and a 'key =' inside the string
system_prompt = \"\"\"
You are terse. # really
seed = 7
\"\"\"  # keep this comment
seed = 3  # fixed while I debug
"""


def test_a_hand_edited_file_keeps_its_comments_and_other_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, HAND_EDITED)
    os.chmod(path, 0o644)
    old = load_config(path)
    new = dataclasses.replace(old, temperature=0.9, seed=None, top_p=0.5)
    save_config(new, path)
    assert path.read_text() == """\
# my specchat settings
temperature = 0.9   # a little warmth
top_k = 40

# the prompt, with a '#' and a 'key =' inside the string
system_prompt = \"\"\"
You are terse. # really
seed = 7
\"\"\"  # keep this comment
# seed = 3  # fixed while I debug
top_p = 0.5
"""
    assert load_config(path) == new
    assert _mode(path) == 0o600  # the mode of an existing file is tightened too
    # A changed multi-line string is rewritten in place, its trailing comment kept.
    newer = dataclasses.replace(new, system_prompt="Be brief.")
    save_config(newer, path)
    assert 'system_prompt = "Be brief."  # keep this comment\n' in path.read_text()
    assert "seed = 7" not in path.read_text() and load_config(path) == newer


def test_unchanged_settings_leave_the_file_as_it_was(tmp_path: Path) -> None:
    path = _write(tmp_path, "temperature = 1   # an int in the file, a float in Config\n"
                            "draft_length = 4\n")
    save_config(load_config(path), path)
    assert path.read_text() == ("temperature = 1   # an int in the file, a float in Config\n"
                                "draft_length = 4\n")


def test_crlf_files_keep_crlf(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b"# windows\r\ntop_k = 5\r\n")
    save_config(Config(top_k=6, max_tokens=99), path)
    assert path.read_bytes() == b"# windows\r\ntop_k = 6\r\nmax_tokens = 99\r\n"


def test_created_directories_are_0700_existing_ones_untouched(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "new" / "specchat" / "config.toml"
    save_config(Config(top_k=3), path)
    assert _mode(path) == 0o600
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "specchat") == 0o700
    assert _mode(tmp_path) == 0o755
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temporary file left


def test_a_symlinked_config_file_is_updated_through_the_link(tmp_path: Path) -> None:
    real = _write(tmp_path, "top_k = 1\n")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    save_config(Config(top_k=2), link)
    assert link.is_symlink() and load_config(real).top_k == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_a_config_error(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = _write(directory, "top_k = 1\n")
    os.chmod(directory, 0o500)
    try:
        with pytest.raises(ConfigError, match=r"ro/config\.toml: Permission denied"):
            save_config(Config(top_k=2), path)
    finally:
        os.chmod(directory, 0o700)
    assert path.read_text() == "top_k = 1\n"


def test_a_refused_write_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-only case simulated, so that it also runs as root."""
    path = _write(tmp_path, "top_k = 1\n")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ConfigError, match=r"config\.toml: Permission denied\.$"):
        save_config(Config(top_k=2), path)
    assert path.read_text() == "top_k = 1\n"


def test_a_full_disk_leaves_the_old_file_and_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "# mine\ntop_k = 1\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ConfigError, match=r"config\.toml: No space left on device"):
        save_config(Config(top_k=2), path)
    assert path.read_text() == "# mine\ntop_k = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_a_parent_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"afile/config\.toml: Not a directory"):
        save_config(Config(top_k=2), tmp_path / "afile" / "config.toml")


def test_a_broken_file_is_not_overwritten(tmp_path: Path) -> None:
    path = _write(tmp_path, "# mine\ntop_k = [\n")
    with pytest.raises(ConfigError, match=r"config\.toml"):
        save_config(Config(top_k=2), path)
    assert path.read_text() == "# mine\ntop_k = [\n"


def test_the_draft_runs_on_the_targets_backend_unless_told_otherwise(tmp_path: Path) -> None:
    assert Config(backend="hf").draft_backend_name == "hf"
    config = load_config(_write(tmp_path, 'backend = "hf"\ndraft_backend = "llama"\n'))
    assert (config.backend, config.draft_backend_name) == ("hf", "llama")
