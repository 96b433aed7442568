"""The settings a chat goes on with, kept with it: its preset's name and the values in force of
``CHAT_SETTINGS``, recorded when the chat starts and again when they change; a reopened chat is
answered with them again.

``ChatSettings.of(config)`` takes them from a ``Config``; ``to_json`` and ``from_json`` are their
form in the history and in chat files (``from_json`` refuses a value its setting does not allow
with a ``ValueError``, and ignores keys it does not know). ``reopened`` gives the ``Config`` a chat
reopens with, and a note when its preset is no longer in the config (its recorded values are
used then).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from chatapp.settings.config import Config
from chatapp.settings.options import OPTIONS, OptionError
from chatapp.settings.presets import find_preset

# What a chat keeps: what a preset sets, and the reply's length and the overflow policy.
CHAT_SETTINGS = ("system_prompt", "temperature", "top_k", "top_p", "draft_length", "drafter",
                 "max_tokens", "overflow")


@dataclass(frozen=True)
class ChatSettings:
    """A chat's ``preset`` ("" none) and its settings, (name, value) pairs of ``CHAT_SETTINGS``
    (an imported chat may hold fewer)."""

    preset: str
    values: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, config: Config) -> ChatSettings:
        """The preset name and the ``CHAT_SETTINGS`` values of ``config``."""
        return cls(config.preset, tuple((name, getattr(config, name)) for name in CHAT_SETTINGS))

    def to_json(self) -> dict[str, Any]:
        """A JSON object: ``preset`` and one key per setting (K a number or "auto")."""
        values = {name: int(value) if name == "draft_length" and value != "auto" else value
                  for name, value in self.values}
        return {"preset": self.preset, **values}

    @classmethod
    def from_json(cls, data: Any) -> ChatSettings:
        """The settings of ``to_json``'s object ``data``; ``ValueError`` saying what is wrong."""
        if not isinstance(data, dict) or not isinstance(data.get("preset", ""), str):
            raise ValueError('the settings are not an object with a text "preset"')
        values = []
        for name in CHAT_SETTINGS:
            if name not in data:
                continue
            option = OPTIONS[name]
            try:
                value = option.from_toml(data[name])
            except OptionError as error:
                raise ValueError(f"the settings' {error}") from None
            problem = option.problem(value)
            if problem is not None:
                raise ValueError(f"the settings' {problem}")
            values.append((name, value))
        return cls(data.get("preset", ""), tuple(values))

    def reopened(self, config: Config) -> tuple[Config, str]:
        """``config`` with these settings and preset name, and a note for the user when that
        preset is no longer among ``config.presets`` ("" otherwise)."""
        reopened = dataclasses.replace(config, preset=self.preset, **dict(self.values))
        if not self.preset or find_preset(config.presets, self.preset) is not None:
            return reopened, ""
        return reopened, (f"This chat was started with the preset '{self.preset}', which is no "
                          "longer in the config file: it goes on with the settings it had.")
