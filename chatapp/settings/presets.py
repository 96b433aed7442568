"""Named presets: a system prompt, sampling, the draft length and the drafter under one name.

A preset sets some of ``PRESET_KEYS``, the keys of a ``[presets.NAME]`` table of the config file
(``system`` sets ``system_prompt``, ``k`` the draft length ``draft_length``, the others the
setting of their name); what it leaves out keeps the value it had. ``BUILTIN_PRESETS`` ship with
specchat; a table of the same name in the user's file replaces a built-in one
(``presets_from_table``). Precedence: command-line options > the preset > the file's other
values > the defaults (``chatapp.settings.config``).

This module reads tables and knows no file: a problem is a ``PresetError`` whose text names the
preset and the key; ``chatapp.settings.config`` adds the file and the line.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from chatapp.settings.options import OPTIONS, OptionError

# The keys of a [presets.NAME] table -> the Config fields they set.
PRESET_KEYS = {"system": "system_prompt", "temperature": "temperature", "top_k": "top_k",
               "top_p": "top_p", "k": "draft_length", "drafter": "drafter"}


class PresetError(ValueError):
    """A preset that cannot be used; the text names it and says how to fix it."""


@dataclass(frozen=True)
class Preset:
    """A preset ``name`` and the Config fields it sets, as (field, value) pairs."""

    name: str
    values: tuple[tuple[str, Any], ...]

    @property
    def settings(self) -> dict[str, Any]:
        """The Config fields this preset sets, and their values."""
        return dict(self.values)

    def summary(self) -> str:
        """What the preset sets, on one line: "T 0, K auto, drafter ngram+model, system prompt"."""
        parts = []
        for field, value in self.values:
            if field == "system_prompt":
                parts.append("system prompt" if value else "no system prompt")
            else:
                short = {"temperature": "T", "draft_length": "K", "top_k": "top-k",
                         "top_p": "top-p"}.get(field, field)
                parts.append(f"{short} {value:g}" if isinstance(value, float)
                             else f"{short} {value}")
        return ", ".join(parts)


def preset_of(name: str, table: dict[str, Any]) -> Preset:
    """The preset ``name`` of the TOML table ``table``; ``PresetError`` for an unknown key, a
    value of the wrong type or one its setting does not allow."""
    values = []
    for key, value in table.items():
        field = PRESET_KEYS.get(key)
        if field is None:
            close = difflib.get_close_matches(key, PRESET_KEYS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise PresetError(f"preset '{name}' has an unknown key '{key}'.{hint} A preset may "
                              f"set {', '.join(PRESET_KEYS)}.")
        option = OPTIONS[field]
        try:
            parsed = option.from_toml(value)
        except OptionError as error:
            raise PresetError(f"preset '{name}': {str(error).replace(repr(field), repr(key))}"
                              ) from None
        problem = option.problem(parsed)
        if problem is not None:
            raise PresetError(f"preset '{name}': {problem.replace(field, key, 1)}")
        values.append((field, parsed))
    return Preset(name, tuple(values))


CODE_PROMPT = ("You are a careful programming assistant. Answer with working code first, then "
               "a short explanation. Keep the user's names and style; change only what is asked.")

BUILTIN_PRESETS: tuple[Preset, ...] = (
    preset_of("code", {"system": CODE_PROMPT, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                       "k": "auto", "drafter": "ngram+model"}),
    preset_of("chat", {"system": "", "temperature": 0.7, "top_k": 40, "top_p": 0.95,
                       "k": "auto", "drafter": "ngram+model"}),
)


def presets_from_table(table: Any) -> tuple[Preset, ...]:
    """The built-in presets, then the ``[presets.NAME]`` tables of ``table`` (the file's
    ``presets`` value): a table named like a built-in preset replaces it. ``PresetError`` for a
    value that is no table of tables, and for a bad preset."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise PresetError("'presets' holds one table per preset: write [presets.NAME] and its "
                          "keys under it.")
    found = {preset.name: preset for preset in BUILTIN_PRESETS}
    for name, values in table.items():
        found[name] = preset_of(name, values)
    return tuple(found.values())


def find_preset(presets: tuple[Preset, ...], name: str) -> Preset | None:
    """The preset called ``name`` among ``presets``; None when there is none."""
    return next((preset for preset in presets if preset.name == name), None)


def unknown_preset(presets: tuple[Preset, ...], name: str) -> str:
    """Why the preset ``name`` cannot be chosen, with the names that can."""
    names = [preset.name for preset in presets]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return (f"preset '{name}' is not defined.{hint} Presets: {', '.join(names)}; define one "
            f"as a [presets.{name}] table in the config file.")
