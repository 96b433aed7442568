"""specchat's user folders and private files: the one place that creates them.

Folders (platformdirs, for the app name "specchat"): ``config_dir()`` (the config file),
``cache_dir()`` (joined models, converted weights), ``state_dir()`` (the auto policy's memory, the
crash log), ``data_dir()`` (the history), and ``documents_dir()`` (where exports go).

Privacy, whatever the umask: every folder specchat creates is 0700 (``private_dir``) and every
file it writes is 0600. Folders that already existed keep their mode (``~/.cache``, a models
folder the user made), except specchat's own folders above (``app_dirs()``) and the ones between
such a folder and the one asked for, which are tightened to 0700 (an older version made some of
them 0755). Tightening is best effort: a symlink, a read-only file system or another user's
folder is left as it is.

Writes: ``write_private`` replaces a file atomically (a temporary file in the same folder,
fsync, ``os.replace``, fsync of the folder), so a reader sees the old file or the new one,
never half of one; ``open_private`` streams a file from empty (the caller renames it into place);
``open_private_log`` appends; ``create_private_file`` makes an empty file for a program (SQLite)
that opens it itself.

Reads of files a user names (an attachment, a chat to import): ``read_regular`` opens without
blocking, refuses anything but a regular file on the open file itself (a path swapped for a FIFO
after a check is refused too) and reads at most a limit.

Remembered state (what specchat keeps from one start to the next only to save time): JSON read
with ``read_json_object`` (empty when missing or damaged) and written with ``remember_json``
(best effort: a failed write is skipped).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, BinaryIO

from platformdirs import (
    user_cache_dir,
    user_config_dir,
    user_data_dir,
    user_documents_dir,
    user_state_dir,
)

APP_NAME = "specchat"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def config_dir() -> Path:
    """specchat's config folder (``~/.config/specchat`` on Linux)."""
    return Path(user_config_dir(APP_NAME))


def cache_dir() -> Path:
    """specchat's cache folder (``~/.cache/specchat`` on Linux)."""
    return Path(user_cache_dir(APP_NAME))


def state_dir() -> Path:
    """specchat's state folder (``~/.local/state/specchat`` on Linux)."""
    return Path(user_state_dir(APP_NAME))


def data_dir() -> Path:
    """specchat's data folder (``~/.local/share/specchat`` on Linux)."""
    return Path(user_data_dir(APP_NAME))


def documents_dir() -> Path:
    """The user's documents folder (it may not exist)."""
    return Path(user_documents_dir())


def app_dirs() -> tuple[Path, ...]:
    """specchat's own folders: tightened to 0700 whoever made them."""
    return config_dir(), cache_dir(), state_dir(), data_dir()


def private_dir(path: Path) -> Path:
    """Make sure the folder ``path`` exists, creating it and any missing parents 0700; return it.

    Folders that already existed keep their mode, except specchat's own (``app_dirs()``) and the
    ones between such a folder and ``path``, which are tightened to 0700. An existing file where a
    folder should be raises ``NotADirectoryError``; other failures raise their ``OSError``.
    """
    path = Path(path)
    missing = []
    folder = path
    while not folder.is_dir() and folder.parent != folder:
        if folder.exists() or folder.is_symlink():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by another process, which sets its mode
        os.chmod(folder, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    for root in app_dirs():
        for folder in (path, *path.parents):
            if folder != root and root not in folder.parents:
                break
            _tighten(folder, PRIVATE_DIR_MODE)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically by a 0600 file holding ``data``; the folder must exist.

    The bytes go to a temporary file next to ``path``, which is fsynced and renamed over it, then
    the folder is fsynced. On any failure the temporary file is removed, ``path`` is left as it
    was, and the error (``OSError``) is raised.
    """
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            _fchmod(handle.fileno(), PRIVATE_FILE_MODE)  # in case of an odd umask
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        try:
            os.unlink(temp_name)
        except OSError:
            pass
        raise
    _fsync_folder(path.parent)


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder, not a regular file."""


class FileTooLarge(OSError):
    """The file is larger than the reader's limit."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``; ``NotRegularFile`` for anything else (never
    blocking on a FIFO), ``FileTooLarge`` when it has more than ``limit`` bytes, or the
    ``OSError`` of the open or the read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileTooLarge(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when the file is missing or unreadable, is not JSON or
    holds another kind of value."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember_json(path: Path, data: Any, indent: int | None = None) -> None:
    """Write ``data`` as JSON to ``path`` (``write_private``, in a ``private_dir``); an
    ``OSError`` is skipped: only what the file would have saved is lost."""
    try:
        private_dir(path.parent)
        write_private(path, json.dumps(data, indent=indent).encode("utf-8"))
    except OSError:
        pass


def open_private(path: Path) -> BinaryIO:
    """Open ``path`` for writing from empty, as a 0600 file (an existing file is tightened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    return _fdopen_private(fd, "wb")


def open_private_log(path: Path) -> IO[str]:
    """Open the text file ``path`` for appending, line-buffered, creating it 0600 (an existing
    file is tightened to 0600) in a private folder (``private_dir``)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    return _fdopen_private(fd, "a", buffering=1)


def create_private_file(path: Path) -> None:
    """Make sure ``path`` exists as a 0600 file in a private folder, its content untouched (for a
    program such as SQLite that opens the file itself)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        _fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def make_tree_private(top: Path) -> None:
    """Make ``top`` and every folder below it 0700 and every file 0600 (for a folder specchat
    wrote in full, such as a converted model before it is moved into place)."""
    _tighten(top, PRIVATE_DIR_MODE)
    for folder, dirs, files in os.walk(top):
        for name in dirs:
            _tighten(Path(folder) / name, PRIVATE_DIR_MODE)
        for name in files:
            _tighten(Path(folder) / name, PRIVATE_FILE_MODE)


def _fdopen_private(fd: int, mode: str, **kwargs: int) -> IO:
    """``os.fdopen`` of a file descriptor made 0600 first; the descriptor is closed on failure."""
    try:
        _fchmod(fd, PRIVATE_FILE_MODE)  # O_CREAT's mode is masked by the umask
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def _fchmod(fd: int, mode: int) -> None:
    if hasattr(os, "fchmod"):  # not on Windows before Python 3.13
        os.fchmod(fd, mode)


def _fsync_folder(folder: Path) -> None:
    """fsync ``folder`` so that a rename in it is durable (best effort: some systems cannot
    open a folder)."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` if it is not already, and if it is ours to chmod (best effort:
    a symlink, a read-only file system or a folder of another user is left as it is)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or stat.S_IMODE(info.st_mode) == mode:
            return
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return
        os.chmod(path, mode)
    except OSError:
        pass
