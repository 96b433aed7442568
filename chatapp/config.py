"""Settings: a frozen dataclass, read from TOML in the user config dir, overridden by CLI flags.

``load_config(path)`` returns the defaults when the file does not exist. Any problem in the file
(TOML syntax, an unknown key, a value of the wrong type or out of range) raises ``ConfigError``
whose message names the file, the line and the key, and says what is allowed.

Writing the settings back (the settings screen's "Save as defaults") is ``chatapp.config_file``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chatapp.backends.rpc import parse_endpoints
from chatapp.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from chatapp.errors import UserFacingError
from chatapp.draft_policy import MAX_DRAFT_LENGTH
from chatapp.user_files import config_dir

BACKENDS = ("llama", "hf")
DRAFT_BACKENDS = ("same", *BACKENDS)
DRAFTERS = ("model", "ngram", "ngram+model")


class ConfigError(UserFacingError, ValueError):
    """A setting is invalid; the message says where and how to fix it."""


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
    seed: int | None = None
    max_tokens: int = 1024
    system_prompt: str = ""
    n_ctx: int = 4096
    threads: int | None = None
    gpu_layers: int = 0
    device: str = "auto"
    dtype: str = "auto"
    rpc: tuple[str, ...] = ()  # "host:port" of RPC servers that hold the target's layers
    tensor_split: tuple[float, ...] = ()  # one weight per RPC device; empty: by free memory

    def __post_init__(self) -> None:
        for problem in _range_problems(self):
            raise ConfigError(problem)

    @property
    def draft_backend_name(self) -> str:
        """The backend the draft model runs on: ``draft_backend``, or the target's for "same"."""
        return self.backend if self.draft_backend == "same" else self.draft_backend

    def with_overrides(self, **overrides: Any) -> "Config":
        """A copy with every non-None override applied (CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def fixed_draft_length(self) -> int | None:
        """K as a number, or None for "auto"."""
        return None if self.draft_length == "auto" else int(self.draft_length)


def default_config_path() -> Path:
    return config_dir() / "config.toml"


def load_config(path: Path | None = None) -> Config:
    path = path or default_config_path()
    if not path.is_file():
        return Config()
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}. Fix the TOML syntax there.") from None
    return config_from_table(data, path, text)


def config_from_table(data: dict[str, Any], path: Path, text: str) -> Config:
    """The Config of a parsed TOML table ``data`` read from ``text`` of the file ``path``; a
    ``ConfigError`` naming the file, the line and the key for an unknown key or a bad value."""
    known = {f.name: f for f in fields(Config)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}, line {_line_of(text, key)}"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"{where}: unknown setting '{key}'.{hint} "
                              f"Known settings: {', '.join(known)}.")
        values[key] = _coerce(key, value, where)
    try:
        return Config(**values)
    except ConfigError as error:
        key = str(error).split(" ", 1)[0]
        raise ConfigError(f"{path}, line {_line_of(text, key)}: {error}") from None


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check a TOML value against the field's type; draft_length accepts an int or "auto"; the
    list settings (rpc, tensor_split) become tuples."""
    if key in _LIST_TYPES:
        item = _LIST_TYPES[key]
        if not isinstance(value, list) or not all(
                isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: '{key}' must be a list of {_LIST_HINTS[key]}, "
                              f"got {value!r}.")
        return tuple(float(v) if item is not str else v for v in value)
    if key == "draft_length":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if value == "auto":
            return value
        raise ConfigError(f"{where}: 'draft_length' must be a whole number 0..{MAX_DRAFT_LENGTH} "
                          f"or \"auto\", got {value!r}.")
    expected = _FIELD_TYPES[key]
    if isinstance(value, bool) or not isinstance(value, expected):
        if float in expected and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        names = " or ".join(t.__name__ for t in expected)
        raise ConfigError(f"{where}: '{key}' must be {names}, got {type(value).__name__} {value!r}.")
    return value


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "draft": (str,), "target": (str,), "backend": (str,), "draft_backend": (str,),
    "drafter": (str,),
    "temperature": (float,), "top_k": (int,), "top_p": (float,), "seed": (int,),
    "max_tokens": (int,), "system_prompt": (str,), "n_ctx": (int,), "threads": (int,),
    "gpu_layers": (int,), "device": (str,), "dtype": (str,),
}
_LIST_TYPES: dict[str, type | tuple[type, ...]] = {"rpc": str, "tensor_split": (int, float)}
_LIST_HINTS = {"rpc": 'strings "host:port"', "tensor_split": "numbers, one per RPC device"}


def _range_problems(config: Config) -> list[str]:
    """Every out-of-range value, each message starting with the key's name."""
    problems = []
    if config.backend not in BACKENDS:
        problems.append(f"backend must be one of {', '.join(BACKENDS)}, got {config.backend!r}.")
    if config.draft_backend not in DRAFT_BACKENDS:
        problems.append(f"draft_backend must be one of {', '.join(DRAFT_BACKENDS)}, "
                        f"got {config.draft_backend!r}.")
    if config.drafter not in DRAFTERS:
        problems.append(f"drafter must be one of {', '.join(DRAFTERS)}, got {config.drafter!r}.")
    if config.draft_length != "auto" and not (
            config.draft_length.isdigit() and int(config.draft_length) <= MAX_DRAFT_LENGTH):
        problems.append(f"draft_length must be 0..{MAX_DRAFT_LENGTH} or auto, "
                        f"got {config.draft_length!r}.")
    if not config.temperature >= 0:
        problems.append(f"temperature must be >= 0, got {config.temperature}.")
    if config.top_k < 0:
        problems.append(f"top_k must be >= 0 (0 = off), got {config.top_k}.")
    if not 0 < config.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {config.top_p}.")
    if config.max_tokens < 1:
        problems.append(f"max_tokens must be >= 1, got {config.max_tokens}.")
    if config.n_ctx < 64:
        problems.append(f"n_ctx must be >= 64, got {config.n_ctx}.")
    if config.threads is not None and config.threads < 1:
        problems.append(f"threads must be >= 1, got {config.threads}.")
    if config.dtype not in ("auto", "float32", "bfloat16", "float16"):
        problems.append(f"dtype must be auto, float32, bfloat16 or float16, got {config.dtype!r}.")
    if config.device not in ("auto", "cpu", "cuda") and not config.device.startswith("cuda:"):
        problems.append(f"device must be auto, cpu or cuda[:N], got {config.device!r}.")
    problems += _rpc_problems(config)
    return problems


def _rpc_problems(config: Config) -> list[str]:
    problems = []
    try:
        parse_endpoints(config.rpc)
    except ValueError as error:
        problems.append(f"rpc must list RPC servers as host:port: {error}.")
    if config.rpc and config.backend != "llama":
        problems.append("rpc needs backend llama (the RPC servers run llama.cpp), got "
                        f"{config.backend!r}.")
    if config.tensor_split and not config.rpc:
        problems.append("tensor_split splits the target over the rpc servers: set rpc too.")
    if any(not w >= 0 for w in config.tensor_split) or (
            config.tensor_split and not sum(config.tensor_split) > 0):
        problems.append(f"tensor_split weights must be >= 0, not all 0, got "
                        f"{list(config.tensor_split)}.")
    return problems


def _line_of(text: str, key: str) -> int:
    match = re.search(rf"^[ \t]*{re.escape(key)}[ \t]*=", text, flags=re.MULTILINE)
    return text.count("\n", 0, match.start()) + 1 if match else 1
