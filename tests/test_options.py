"""chatapp.settings.options is the one source of the settings' rules: the config, the CLI and the
Settings screen refuse the same values with the same text."""

from __future__ import annotations

import dataclasses

import pytest

from chatapp.cli import main
from chatapp.settings.config import Config, ConfigError
from chatapp.settings.options import OPTIONS, OptionError

BAD = {"temperature": "-1", "top_k": "-1", "top_p": "1.5", "max_tokens": "0", "n_ctx": "63",
       "threads": "0", "draft_length": "17", "device": "gpu"}


def test_every_config_field_has_an_option() -> None:
    # but the presets: tables of their own (chatapp.settings.presets)
    assert sorted(OPTIONS) == sorted(f.name for f in dataclasses.fields(Config)
                                     if f.name != "presets")


@pytest.mark.parametrize("name, text", sorted(BAD.items()))
def test_config_and_cli_refuse_the_same_values_with_the_same_rule(
        name: str, text: str, capsys: pytest.CaptureFixture) -> None:
    option = OPTIONS[name]
    with pytest.raises(OptionError) as parse_error:
        option.parse(text)
    value = text if option.kind is str else option.kind(text)
    with pytest.raises(ConfigError) as config_error:
        Config(**{name: value})
    rule = f"must be {option.rule.text}"
    assert rule in str(parse_error.value) and str(config_error.value).startswith(f"{name} {rule}")
    with pytest.raises(SystemExit):
        main(["run", f"--{name.replace('_', '-')}", text, "x"])
    assert rule in capsys.readouterr().err


def test_a_value_of_the_wrong_type_says_what_is_wanted() -> None:
    with pytest.raises(OptionError, match=r"must be a whole number, got 'ten'"):
        OPTIONS["top_k"].parse("ten")
    with pytest.raises(OptionError, match=r"must be a number, got 'warm'"):
        OPTIONS["temperature"].parse("warm")
