"""Files named in a typed message: ``@path`` words.

A word that starts with ``@`` (at the start of a line or after whitespace) names a file to attach:
``@src/app.py``, ``@~/notes.txt``, or quoted for a path with spaces, ``@"my notes.txt"``. A path
ends before trailing punctuation (``see @app.py.`` names ``app.py``). Words inside fenced code
blocks are text, not files, so pasted code with decorators goes as typed.

``mentioned_paths`` finds the words of a message; ``read_mentions`` reads the files they name
(``chatapp.chat.attachments.read_attachment``, relative to a folder, ``~`` expanded). The words
stay in the message's text as typed, so that the sentence still says what was asked ("rename a
in @calc.py"); the files go with it as attachments;
``mentions_to_count`` is the message as the context meter counts it while it is typed;
``complete_path`` completes a path being typed after ``@`` (the longest common prefix of the
entries that match).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from chatapp.chat.attachments import (
    Attachment,
    AttachmentError,
    attachment_path,
    read_attachment,
)

# A quoted path, or a run of non-space characters not ending in punctuation.
MENTION = re.compile(r'(?<!\S)@(?:"([^"\n]+)"|(\S*[^\s.,;:!?)\]}>"\']))')
FENCE = re.compile(r"^ *(```|~~~).*?(?:^ *\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
# The @word the cursor is at the end of, in the text before the cursor.
TYPING = re.compile(r'(?<!\S)@([^\s"]*)\Z')
# The largest file the context meter reads and counts while a message is typed (on the UI
# thread: its tokenizing must not stall the typing; docs/benchmarks.md has the times).
METER_BYTES = 32 * 1024


def mention(path: str) -> str:
    """The ``@`` word that names ``path`` (quoted when it holds whitespace)."""
    return f'@"{path}"' if re.search(r"\s", path) else f"@{path}"


def mentioned_paths(text: str) -> list[str]:
    """The paths of ``text``'s ``@path`` words (fenced code aside), in order, each once."""
    fenced = [match.span() for match in FENCE.finditer(text)]
    paths: list[str] = []
    for match in MENTION.finditer(text):
        path = match.group(1) or match.group(2)
        if path not in paths and not any(start <= match.start() < stop
                                         for start, stop in fenced):
            paths.append(path)
    return paths


def read_mentions(text: str, folder: Path) -> tuple[str, list[Attachment]]:
    """``text`` as typed, and the files its ``@path`` words name read as attachments (paths
    relative to ``folder``); ``AttachmentError`` for the first that cannot be attached, with a
    hint for an ``@`` that was not meant as a file."""
    attachments = []
    for path in mentioned_paths(text):
        try:
            attachments.append(read_attachment(path, folder))
        except AttachmentError as error:
            raise AttachmentError(f"@{path}: {error} (A word starting with @ attaches a file; "
                                  "in a ``` code block it is sent as typed.)") from None
    return text, attachments


def mentions_to_count(text: str, folder: Path) -> tuple[str, list[Attachment]]:
    """``text`` and the files the context meter counts with it before it is sent: as
    ``read_mentions`` reads them, those that can be attached and hold at most ``METER_BYTES``
    (read while the user types)."""
    files: dict[str, Attachment] = {}
    for path in mentioned_paths(text):
        try:
            if attachment_path(path, folder).stat().st_size <= METER_BYTES:
                files[path] = read_attachment(path, folder)
        except (OSError, AttachmentError):
            continue
    return text, list(files.values())


def typed_fragment(before_cursor: str) -> str | None:
    """The path typed after ``@`` right before the cursor (``before_cursor`` is the line up to
    it); None when the cursor is not after an ``@`` word."""
    match = TYPING.search(before_cursor)
    return match.group(1) if match else None


def complete_path(fragment: str, folder: Path) -> tuple[str, list[str]]:
    """Complete ``fragment``, a path being typed (relative to ``folder``, ``~`` expanded): the
    fragment extended by the longest common prefix of the matching entries of its folder (a
    single folder gets its ``/``), and the matching names (folders with ``/``), sorted. Hidden
    entries match only a name that starts with a dot; a completion stops before whitespace."""
    head, slash, name = fragment.rpartition("/")
    base = Path(os.path.expanduser(head + slash) or ".")
    base = base if base.is_absolute() else folder / base
    try:
        entries = sorted(os.scandir(base), key=lambda entry: entry.name)
    except OSError:
        return fragment, []
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries
             if entry.name.startswith(name) and (name.startswith(".") or entry.name[0] != ".")]
    if not names:
        return fragment, []
    common = os.path.commonprefix(names)
    common = re.split(r"\s", common, maxsplit=1)[0]
    return fragment[:len(fragment) - len(name)] + common, names
