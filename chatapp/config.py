"""Settings: a frozen dataclass, read from TOML in the user config dir, overridden by CLI flags.

``load_config(path)`` returns the defaults when the file does not exist. Any problem in the file
(TOML syntax, an unknown key, a value of the wrong type or out of range) raises ``ConfigError``
whose message names the file, the line and the key, and says what is allowed.

``save_config(config, path)`` writes the settings back (the settings screen's "Save as defaults"):
atomically, the file 0600, keeping a hand-edited file's comments and other lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chatapp.backends.rpc import parse_endpoints
from chatapp.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from chatapp.errors import UserFacingError
from chatapp.draft_policy import MAX_DRAFT_LENGTH
from chatapp.user_files import config_dir, private_dir, write_private

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
    return _config_from_table(data, path, text)


def _config_from_table(data: dict[str, Any], path: Path, text: str) -> Config:
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


# -- saving ---------------------------------------------------------------------------------------

_SAVED_HEADER = ("# specchat settings (see the README). Written by the settings screen's\n"
                 "# \"Save as defaults\"; edits by hand are kept, comments included.\n")


def save_config(config: Config, path: Path | None = None) -> Path:
    """Write ``config`` to the TOML file ``path`` (default: the user config file); return the path.

    An existing file keeps its comments and other lines: only the ``key = value`` statements whose
    value changed are rewritten (a setting set back to "none", like ``seed``, is commented out),
    and keys not yet in the file are appended when they differ from the defaults. The write is
    atomic (a temporary file in the same directory, fsync, ``os.replace``); the file ends up 0600
    and any directory created for it 0700. A symlink is followed, so the file it points to is
    updated. Any failure raises ``ConfigError`` naming the file and the reason; the old file is
    then left as it was.
    """
    path = path or default_config_path()
    try:
        target = path.resolve() if path.is_symlink() else path
        # bytes, not read_text: its newline translation would turn a file's CRLFs into LFs
        old_text = target.read_bytes().decode("utf-8") if target.is_file() else None
    except (OSError, RuntimeError, UnicodeDecodeError) as error:  # RuntimeError: a symlink loop
        raise ConfigError(f"Could not read {path} to update it: {_reason(error)}.") from None
    text = _updated_text(config, old_text, path)
    try:
        data = tomllib.loads(text)
        written = _config_from_table(data, path, text)
    except (ConfigError, tomllib.TOMLDecodeError) as error:  # never write what would not load
        raise ConfigError(f"Could not save the settings to {path}: {error}") from None
    if written != config:
        raise ConfigError(f"Could not save the settings to {path}: they would not read back the "
                          f"same.")
    try:
        private_dir(target.parent)
        write_private(target, text.encode("utf-8"))
    except (OSError, UnicodeEncodeError) as error:
        raise ConfigError(f"Could not save the settings to {path}: {_reason(error)}.") from None
    return path


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    if isinstance(error, UnicodeError):
        return f"the text is not valid UTF-8 ({error.reason})"
    return str(error) or type(error).__name__


def toml_value(key: str, value: Any) -> str:
    """``value`` of setting ``key`` as TOML (None has no TOML form: callers leave the key out)."""
    if key == "draft_length":
        return '"auto"' if value == "auto" else str(int(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(key, item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest round-trip form: "0.7", "1e-05", "1e+20" are valid TOML
    if isinstance(value, str):
        return _toml_string(value)
    raise TypeError(f"{key}: no TOML form for {type(value).__name__} {value!r}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def _toml_string(value: str) -> str:
    """A one-line TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class _Statement:
    key: str
    start: int  # where the line starts
    value_start: int
    value_end: int  # after the value, before any spaces and comment
    end: int  # end of the statement's last line, before its newline


_BLANK_OR_COMMENT = re.compile(r"[ \t]*(#[^\r\n]*)?(\r?\n|$)")
_KEY = re.compile(r"[ \t]*(?:([A-Za-z0-9_-]+)|\"([^\"\\\r\n]*)\"|'([^'\r\n]*)')[ \t]*=[ \t]*")
_VALUE_END_CANDIDATES = re.compile(r"[#\r\n]")


def _statements(text: str, path: Path) -> list[_Statement]:
    """Every top-level ``key = value`` statement of a flat TOML file, with where it lies.

    A statement's end is the first '#', line break or end of text after which the statement alone
    parses as TOML: so a '#' or a 'key =' inside a (multi-line) string is never taken for a
    comment or another statement.
    """
    found = []
    pos = 0
    while pos < len(text):
        blank = _BLANK_OR_COMMENT.match(text, pos)
        if blank and blank.end() > pos:
            pos = blank.end()
            continue
        key_match = _KEY.match(text, pos)
        if not key_match:
            raise ConfigError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: only "
                              f"'key = value' lines and comments can be updated here.")
        key = next(group for group in key_match.groups() if group is not None)
        value_end = None
        for candidate in _VALUE_END_CANDIDATES.finditer(text, key_match.end()):
            if _parses_alone(text[pos:candidate.start()]):
                value_end = candidate.start()
                break
        if value_end is None:
            if not _parses_alone(text[pos:]):
                raise ConfigError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: the value of "
                                  f"'{key}' does not parse; fix it there first.")
            value_end = len(text)
        line_end = len(text)
        newline = re.compile(r"\r?\n").search(text, value_end)
        if newline:
            line_end = newline.start()
        stripped_end = value_end
        while stripped_end > key_match.end() and text[stripped_end - 1] in " \t":
            stripped_end -= 1
        found.append(_Statement(key, pos, key_match.end(), stripped_end, line_end))
        pos = line_end
    return found


def _parses_alone(statement: str) -> bool:
    try:
        return len(tomllib.loads(statement)) == 1
    except tomllib.TOMLDecodeError:
        return False


def _updated_text(config: Config, old_text: str | None, path: Path) -> str:
    defaults = Config()
    names = [f.name for f in fields(Config)]
    if old_text is None:
        lines = [f"{name} = {toml_value(name, getattr(config, name))}\n" for name in names
                 if getattr(config, name) != getattr(defaults, name)
                 and getattr(config, name) is not None]
        return _SAVED_HEADER + "".join(lines)
    try:
        data = tomllib.loads(old_text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}. Fix the TOML syntax there before saving.") from None
    old = _config_from_table(data, path, old_text)  # unknown keys and bad values: fix them first
    statements = {s.key: s for s in _statements(old_text, path)}
    newline = "\r\n" if "\r\n" in old_text else "\n"
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in old_text
    appended = []
    for name in names:
        value = getattr(config, name)
        statement = statements.get(name)
        if statement is not None:
            if value == getattr(old, name):
                continue
            if value is None:  # no TOML form: comment the setting out
                lines = old_text[statement.start:statement.end].splitlines(keepends=True)
                edits.append((statement.start, statement.end, "".join("# " + line
                                                                      for line in lines)))
            else:
                edits.append((statement.value_start, statement.value_end,
                              toml_value(name, value)))
        elif value != getattr(defaults, name) and value is not None:
            appended.append(f"{name} = {toml_value(name, value)}{newline}")
    text = old_text
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    if appended and text and not text.endswith("\n"):
        text += newline
    return text + "".join(appended)

