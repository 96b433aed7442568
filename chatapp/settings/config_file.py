"""Writing the settings back to their TOML file (the settings screen's "Save as defaults").

``save_config(config, path)`` writes atomically, the file 0600, keeping a hand-edited file's
comments, other lines and tables (``[presets.NAME]``); what it writes always loads back
(``chatapp.settings.config.load_config``) as the same ``Config`` (``saved_form``).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chatapp.settings.config import Config, ConfigError, config_from_table, default_config_path
from chatapp.user_files import private_dir, write_private

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
    config = saved_form(config)
    try:
        target = path.resolve() if path.is_symlink() else path
        # bytes, not read_text: its newline translation would turn a file's CRLFs into LFs
        old_text = target.read_bytes().decode("utf-8") if target.is_file() else None
    except (OSError, RuntimeError, UnicodeDecodeError) as error:  # RuntimeError: a symlink loop
        raise ConfigError(f"Could not read {path} to update it: {_reason(error)}.") from None
    text = _updated_text(config, old_text, path)
    try:
        data = tomllib.loads(text)
        written = config_from_table(data, path, text)
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


def saved_form(config: Config) -> Config:
    """``config`` as its file can hold it: the preset's name is kept only while its values are
    all in force (the file's preset is applied over its other values, so a value changed since
    could not be written under it)."""
    return config if config.holds_preset else config.with_preset("")


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
_TABLE = re.compile(r"[ \t]*\[")  # a table header: the top-level statements end there


def _top_level(text: str, path: Path) -> tuple[list[_Statement], int]:
    """Every top-level ``key = value`` statement of a TOML file (those before its first table
    header) with where it lies, and where that header starts (``len(text)``: no table).

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
        if _TABLE.match(text, pos):
            return found, pos
        key_match = _KEY.match(text, pos)
        if not key_match:
            raise ConfigError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: only "
                              f"'key = value' lines and comments can be updated here.")
        key = next(group for group in key_match.groups() if group is not None)
        value_end: int | None = _value_end(text, key_match.end())
        if not _parses_alone(text[pos:value_end]):
            value_end = _first_end_that_parses(text, pos, key_match.end())
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
    return found, len(text)


def _first_end_that_parses(text: str, pos: int, value_start: int) -> int | None:
    """The first '#' or line break after ``value_start`` before which the statement at ``pos``
    parses alone (one parse per candidate: only for what ``_value_end`` misreads)."""
    for candidate in _VALUE_END_CANDIDATES.finditer(text, value_start):
        if _parses_alone(text[pos:candidate.start()]):
            return candidate.start()
    return None


def _value_end(text: str, start: int) -> int:
    """Where the TOML value at ``start`` ends: its first '#' or line break outside its strings
    and brackets (``len(text)``: the end of the text). One pass: a long multi-line string costs
    no more than its length."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char in "\"'":
            i = _string_end(text, i)
            continue
        if char == "#":
            if depth == 0:
                return i
            newline = text.find("\n", i)  # a comment inside an array
            i = len(text) if newline < 0 else newline
            continue
        if char in "\r\n" and depth == 0:
            return i
        depth += (char in "[{") - (char in "]}")
        i += 1
    return len(text)


def _string_end(text: str, start: int) -> int:
    """The index after the TOML string that starts at ``start`` (basic or literal, one-line or
    multi-line; a one-line string left open ends at its line's end)."""
    quote = text[start] * 3 if text.startswith(text[start] * 3, start) else text[start]
    i = start + len(quote)
    while i < len(text):
        if quote[0] == '"' and text[i] == "\\":
            i += 2
            continue
        if text.startswith(quote, i):
            end = i + len(quote)
            while len(quote) == 3 and end < len(text) and text[end] == quote[0] and end - i < 5:
                end += 1  # a multi-line string may end with one or two quotes of its own
            return end
        if len(quote) == 1 and text[i] in "\r\n":
            return i
        i += 1
    return len(text)


def _parses_alone(statement: str) -> bool:
    try:
        return len(tomllib.loads(statement)) == 1
    except tomllib.TOMLDecodeError:
        return False


def _updated_text(config: Config, old_text: str | None, path: Path) -> str:
    defaults = Config()
    names = [f.name for f in fields(Config) if f.name != "presets"]  # tables, kept as they are
    if old_text is None:
        lines = [f"{name} = {toml_value(name, getattr(config, name))}\n" for name in names
                 if getattr(config, name) != getattr(defaults, name)
                 and getattr(config, name) is not None]
        return _SAVED_HEADER + "".join(lines)
    try:
        data = tomllib.loads(old_text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}. Fix the TOML syntax there before saving.") from None
    old = config_from_table(data, path, old_text)  # unknown keys and bad values: fix them first
    statements = {s.key: s for s in _top_level(old_text, path)[0]}
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
    table = _top_level(text, path)[1]
    head, tables = text[:table], text[table:]  # new keys go before the first table
    if appended and head and not head.endswith("\n"):
        head += newline
    return head + "".join(appended) + (newline if appended and tables else "") + tables

