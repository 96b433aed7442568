"""Settings: a frozen dataclass, read from TOML in the user config dir, overridden by CLI flags.

``load_config(path)`` returns the defaults when the file does not exist. Any problem in the file
(TOML syntax, an unknown key, a value of the wrong type or out of range, a bad preset) raises
``ConfigError`` whose message names the file, the line and the key, and says what is allowed.

Presets (``chatapp.settings.presets``): ``presets`` holds the built-in ones and the file's
``[presets.NAME]`` tables; ``preset`` names the one chosen ("" none). Precedence: command-line
options > the preset > the file's other values > the defaults: the file's ``preset = "NAME"`` is
applied over its other values (``with_preset``), the command line over both.

Writing the settings back (the settings screen's "Save as defaults") is
``chatapp.settings.config_file``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chatapp.backends.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from chatapp.backends.endpoints import parse_endpoints
from chatapp.errors import UserFacingError
from chatapp.settings.options import OPTIONS, OptionError, problems
from chatapp.settings.presets import (
    BUILTIN_PRESETS,
    Preset,
    PresetError,
    find_preset,
    presets_from_table,
    unknown_preset,
)
from chatapp.user_files import config_dir, read_regular


class ConfigError(UserFacingError, ValueError):
    """A setting is invalid; the message says where and how to fix it."""


MAX_CONFIG_BYTES = 1024 * 1024  # a config file is a few hundred bytes; larger is a mistake
# Fields whose change needs the models loaded again.
RELOAD_FIELDS = ("target", "draft", "backend", "draft_backend", "drafter", "n_ctx", "threads",
                 "gpu_layers", "device", "dtype", "rpc", "tensor_split")


@dataclass(frozen=True)
class Config:
    draft: str = DEFAULT_DRAFT
    target: str = DEFAULT_TARGET
    backend: str = "llama"
    draft_backend: str = "same"  # the draft model's backend; "same" as the target's
    drafter: str = "ngram+model"  # prompt lookup first, the draft model when nothing matches
    draft_length: str = "auto"  # "0".."16" or "auto" (measured: never drafts where it does not pay)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0  # keep tokens at least min_p times as likely as the most likely; 0 = off
    seed: int | None = None
    max_tokens: int = 1024
    system_prompt: str = ""
    # The context window in tokens, or "auto": the target's trained context as far as its KV
    # cache fits in memory with room (``chatapp.backends.context_size``).
    n_ctx: int | str = "auto"
    overflow: str = "drop-oldest"  # a turn over the context: leave the oldest turns out, or refuse
    threads: int | None = None
    gpu_layers: int = 0
    device: str = "auto"
    dtype: str = "auto"
    layout: str = "auto"  # weight layout of catalog models: fastest faithful, shipped, or fast
    rpc: tuple[str, ...] = ()  # "host:port" of RPC servers that hold the target's layers
    tensor_split: tuple[float, ...] = ()  # one weight per RPC device; empty: by free memory
    model_dirs: tuple[str, ...] = ()  # more folders of .gguf models for `specchat models`
    # The preset these settings were chosen from ("" none; a reopened chat's may be gone from
    # ``presets``: the file and the command line choose among them, ``with_preset``).
    preset: str = ""
    presets: tuple[Preset, ...] = BUILTIN_PRESETS  # every preset that can be chosen

    def __post_init__(self) -> None:
        for problem in problems(self) + _rpc_problems(self):
            raise ConfigError(problem)

    def with_preset(self, name: str) -> Config:
        """A copy with the preset ``name``'s values and label ("": the label only cleared);
        ``ConfigError`` naming the presets there are when there is no such preset."""
        if not name:
            return dataclasses.replace(self, preset="")
        preset = find_preset(self.presets, name)
        if preset is None:
            raise ConfigError(unknown_preset(self.presets, name))
        return dataclasses.replace(self, preset=name, **preset.settings)

    @property
    def holds_preset(self) -> bool:
        """Whether every value the chosen preset sets is in force (True without a preset, False
        for one gone from ``presets``)."""
        preset = find_preset(self.presets, self.preset)
        if preset is None:
            return not self.preset
        return all(getattr(self, field) == value for field, value in preset.values)

    def measured_setup(self) -> list[str]:
        """The settings that change what the auto policy measures (costs, acceptance): the key of
        its memory (``chatapp.policy.measurements``). A local run on the default layout setting has
        the key it had before layouts and RPC existed."""
        setup = [self.backend, self.draft_backend_name, self.draft, self.target, self.drafter,
                 str(self.threads), str(self.gpu_layers), self.device, self.dtype]
        if self.layout != "auto":  # other files, other costs
            setup.append(self.layout)
        if self.rpc:  # another layout of the target's layers has other costs
            setup += ["rpc", *self.rpc, *map(str, self.tensor_split)]
        return setup

    @property
    def context_tokens(self) -> int | None:
        """The context window the settings fix, None for "auto"."""
        return self.n_ctx if isinstance(self.n_ctx, int) else None

    @property
    def draft_backend_name(self) -> str:
        """The backend the draft model runs on: ``draft_backend``, or the target's for "same"."""
        return self.backend if self.draft_backend == "same" else self.draft_backend

    def needs_reload(self, old: Config) -> bool:
        """Whether going from ``old`` to these settings needs the models loaded again."""
        return any(getattr(old, name) != getattr(self, name) for name in RELOAD_FIELDS)

    def with_overrides(self, **overrides: Any) -> "Config":
        """A copy with every non-None override applied (CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def fixed_draft_length(self) -> int | None:
        """K as a number, or None for "auto"."""
        return None if self.draft_length == "auto" else int(self.draft_length)


def command_line_settings(config: Config, options: dict[str, Any]) -> dict[str, Any]:
    """What the command line's ``options`` (argparse's, by Config field name; absent ones left
    out) set over ``config``: its preset's values and name (``preset``), then its other options,
    which win. ``ConfigError`` naming the presets there are for an unknown preset."""
    names = {f.name for f in fields(Config)} - {"presets", "preset"}
    given = {key: value for key, value in options.items() if key in names and value is not None}
    if options.get("preset") is None:
        return given
    chosen = config.with_preset(options["preset"])
    preset = find_preset(config.presets, chosen.preset)
    values = preset.settings if preset is not None else {}
    return {"preset": chosen.preset, **values} | given


def default_config_path() -> Path:
    return config_dir() / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The settings of the TOML file ``path`` (default: the user config file; missing: the
    defaults); ``ConfigError`` naming the file (and the line) for anything it cannot use: a
    file that is not a regular UTF-8 file of at most ``MAX_CONFIG_BYTES``, bad TOML, an
    unknown key or a bad value."""
    path = path or default_config_path()
    if not path.is_file():
        return Config()
    try:
        text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: the file is not UTF-8 text (byte {error.start}). Save it "
                          "as UTF-8.") from None
    except OSError as error:
        raise ConfigError(f"{path} cannot be read: {error.strerror or error}.") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}. Fix the TOML syntax there.") from None
    except RecursionError:
        raise ConfigError(f"{path}: values are nested too deeply to read. Fix the TOML "
                          "there.") from None
    return config_from_table(data, path, text)


def config_from_table(data: dict[str, Any], path: Path, text: str) -> Config:
    """The Config of a parsed TOML table ``data`` read from ``text`` of the file ``path``; a
    ``ConfigError`` naming the file, the line and the key for an unknown key or a bad value, the
    file and the preset for a bad preset. The file's ``preset`` is applied over its other values."""
    known = {f.name: f for f in fields(Config) if f.name != "presets"}
    values: dict[str, Any] = {"presets": _presets(data.get("presets", {}), path, text)}
    for key, value in data.items():
        if key == "presets":
            continue
        where = f"{path}, line {_line_of(text, key)}"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"{where}: unknown setting '{key}'.{hint} "
                              f"Known settings: {', '.join(known)}.")
        try:
            values[key] = OPTIONS[key].from_toml(value)
        except OptionError as error:
            raise ConfigError(f"{where}: {error}") from None
    try:
        return Config(**values).with_preset(values.get("preset", ""))
    except ConfigError as error:
        key = str(error).split(" ", 1)[0]
        raise ConfigError(f"{path}, line {_line_of(text, key)}: {error}") from None


def _presets(table: Any, path: Path, text: str) -> tuple[Preset, ...]:
    """The presets there are with the file's ``presets`` table; a ``ConfigError`` naming the
    file, the line of the bad preset's table and the fix."""
    try:
        return presets_from_table(table)
    except PresetError as error:
        name = str(error).split("'")[1] if str(error).startswith("preset '") else ""
        match = re.search(rf"^[ \t]*\[[ \t]*presets\.[\"']?{re.escape(name)}[\"']?[ \t]*\]",
                          text, flags=re.MULTILINE) if name else None
        line = text.count("\n", 0, match.start()) + 1 if match else _line_of(text, "presets")
        raise ConfigError(f"{path}, line {line}: {error}") from None


def _rpc_problems(config: Config) -> list[str]:
    """What is wrong with the RPC settings (the servers' addresses, and their ties to the
    backend and to tensor_split), each text starting with the setting's name."""
    found = []
    try:
        parse_endpoints(config.rpc)
    except ValueError as error:
        found.append(f"rpc must list RPC servers as host:port: {error}.")
    if config.rpc and config.backend != "llama":
        found.append("rpc needs backend llama (the RPC servers run llama.cpp), got "
                        f"{config.backend!r}.")
    if config.tensor_split and not config.rpc:
        found.append("tensor_split splits the target over the rpc servers: set rpc too.")
    if any(not w >= 0 for w in config.tensor_split) or (
            config.tensor_split and not sum(config.tensor_split) > 0):
        found.append(f"tensor_split weights must be >= 0, not all 0, got "
                        f"{list(config.tensor_split)}.")
    return found


def _line_of(text: str, key: str) -> int:
    match = re.search(rf"^[ \t]*{re.escape(key)}[ \t]*=", text, flags=re.MULTILINE)
    return text.count("\n", 0, match.start()) + 1 if match else 1


def rpc_label(endpoints: Sequence[str], short: bool = False) -> str:
    """Where a target on RPC servers runs, for headers and statistics: "on RPC h:p, h:p";
    ``short`` (a header line): "on 2 RPC servers" when there are several."""
    if short and len(endpoints) > 1:
        return f"on {len(endpoints)} RPC servers"
    return f"on RPC {', '.join(endpoints)}" if endpoints else ""
