"""Files attached to a message.

``read_attachment`` reads a path (relative to the folder specchat was started in, ``~``
expanded) into an ``Attachment``: the path as given, the language its name says, the text. It
refuses, with an ``AttachmentError`` that says what to do, a path that is missing, a folder, a
file that is not UTF-8 text (NUL bytes, or bytes that do not decode) and one too large to read
for any context. ``check_fits`` refuses attachments that would not fit the context window, with
how many tokens they need and how many are left.

The models see a message with attachments as ``message_text``: each file in a fenced block tagged
with its language and path, then the typed text. The history keeps the typed text and the
attachments (path, language, text as sent) apart, so a reopened chat shows both and the models
see the same message again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.errors import UserFacingError
from chatapp.user_files import FileTooLarge, NotRegularFile, read_regular

# Larger files are refused before reading: no context window specchat runs with holds them.
MAX_BYTES = 4 * 1024 * 1024

LANGUAGES = {
    "py": "python", "pyi": "python", "js": "javascript", "mjs": "javascript", "jsx": "jsx",
    "ts": "typescript", "tsx": "tsx", "rs": "rust", "go": "go", "c": "c", "h": "c",
    "cc": "cpp", "cpp": "cpp", "cxx": "cpp", "hpp": "cpp", "java": "java", "kt": "kotlin",
    "swift": "swift", "rb": "ruby", "php": "php", "cs": "csharp", "lua": "lua", "r": "r",
    "jl": "julia", "scala": "scala", "hs": "haskell", "ml": "ocaml", "ex": "elixir",
    "sh": "bash", "bash": "bash", "zsh": "zsh", "fish": "fish", "ps1": "powershell",
    "sql": "sql", "html": "html", "htm": "html", "css": "css", "scss": "scss", "xml": "xml",
    "svg": "xml", "json": "json", "jsonl": "json", "toml": "toml", "yaml": "yaml", "yml": "yaml",
    "ini": "ini", "cfg": "ini", "md": "markdown", "rst": "rst", "tex": "latex", "csv": "csv",
    "diff": "diff", "patch": "diff", "txt": "text",
}
NAMES = {"makefile": "makefile", "dockerfile": "dockerfile", "cmakelists.txt": "cmake"}


class AttachmentError(UserFacingError, ValueError):
    """A file that cannot be attached; the message says why and what to do."""


@dataclass(frozen=True)
class Attachment:
    """A file as sent with a message: ``path`` as the user gave it, ``language`` from its name
    ("" when unknown), ``text`` as read then."""

    path: str
    language: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "language": self.language, "text": self.text}

    @classmethod
    def from_json(cls, data: Any) -> Attachment:
        """The attachment ``to_json`` made; ``ValueError`` for anything else."""
        if not isinstance(data, dict) or not all(
                isinstance(data.get(name), str) for name in ("path", "language", "text")):
            raise ValueError("an attachment is an object with a path, a language and a text")
        return cls(data["path"], data["language"], data["text"])

    def fenced(self) -> str:
        """The file as the models see it: its text in a fenced block whose info string is its
        language ("text" when unknown) and its path (the fence longer than any run of backticks
        in the text), the way code is pasted: no line of prose before it, which made the models
        preface their reply (docs/benchmarks.md, "Attached or pasted")."""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)
        body = self.text if self.text.endswith("\n") or not self.text else self.text + "\n"
        return f"{fence}{self.language or 'text'} {self.path}\n{body}{fence}"


def language_of(path: str) -> str:
    """The language a file's name says ("python" for ``x.py``); "" when it says none."""
    name = Path(path).name.lower()
    if name in NAMES:
        return NAMES[name]
    return LANGUAGES.get(name.rpartition(".")[2], "") if "." in name else ""


def attachment_path(path: str, folder: Path | None = None) -> Path:
    """Where the file ``path`` is: ``~`` expanded, relative to ``folder`` (None: the current
    one) unless absolute."""
    where = Path(path).expanduser()
    return where if where.is_absolute() else (folder or Path.cwd()) / where


def read_attachment(path: str, folder: Path | None = None) -> Attachment:
    """The file at ``path`` (``~`` expanded; relative to ``folder``, by default the current
    one) as an attachment; ``AttachmentError`` when it cannot be one."""
    if not path.strip():
        raise AttachmentError("Give the path of a file to attach.")
    where = attachment_path(path, folder)
    if where.is_dir():
        raise AttachmentError(f"{path} is a folder: attach the files in it one by one.")
    if not where.exists():
        raise AttachmentError(f"There is no file {where}: check the path.")
    try:
        data = read_regular(where, MAX_BYTES)
    except NotRegularFile:
        raise AttachmentError(f"{path} is not a regular file: attach a text file.") from None
    except FileTooLarge:
        raise AttachmentError(f"{path} is over {MAX_BYTES // 2**20} MiB, more than any context "
                              "window holds: attach the part that matters.") from None
    except OSError as error:
        raise AttachmentError(f"{path} cannot be read: {error.strerror or error}.") from None
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, data.index(b"\0"), len(data), "NUL byte")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AttachmentError(f"{path} is not a text file (it is binary, or not UTF-8): only "
                              "text can go into the prompt.") from None
    return Attachment(path, language_of(path), text)


def message_text(text: str, attachments: Sequence[Attachment]) -> str:
    """The message the models see: every attachment fenced, in order, then ``text``."""
    return "\n\n".join([attachment.fenced() for attachment in attachments]
                       + ([text] if text or not attachments else []))


def check_fits(text: str, attachments: Sequence[Attachment], count: Callable[[str], int],
               room: int) -> None:
    """Refuse ``attachments`` to the message ``text`` when the message with them would not fit:
    ``count(message)`` is the prompt's length in tokens with that message alone (and the system
    prompt), ``room`` the most a prompt may hold. ``AttachmentError`` says how many tokens the
    files need and how many are left."""
    if not attachments:
        return
    bare = count(text)
    needed = count(message_text(text, attachments)) - bare
    left = max(0, room - bare)
    if needed <= left:
        return
    names = ", ".join(attachment.path for attachment in attachments)
    files = "The file" if len(attachments) == 1 else "The files"
    need = "needs" if len(attachments) == 1 else "need"
    raise AttachmentError(
        f"{files} {names} {need} {needed:,} tokens and {left:,} are left in the context window "
        "(with your message and room for the reply): attach less, or start specchat with a "
        "larger --n-ctx.")
