"""`specchat chats`: the saved chats on the command line (as `llm logs` does).

``specchat chats list`` lists them, ``search TEXT`` finds messages in all of them, ``export ID``
writes one as Markdown or JSON (stdout, or ``-o FILE``), ``import FILE`` makes a new chat from a
JSON export, ``rename ID TITLE`` renames one. It reaches the history through
``chatapp.chat.chats.SavedChats`` only. A mistake (an unknown id, no match, a file that cannot be
read or imported) is one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatapp.errors import UserFacingError
from chatapp.settings.options import arg_type, at_least
from chatapp.user_files import FileTooLarge, NotRegularFile, read_regular, write_private

if TYPE_CHECKING:
    from chatapp.chat.chats import SavedChats

# Around each matching word of a search hit until the line is made printable, then bold.
_MARK = ("\ue000", "\ue001")
_BOLD = ("\x1b[1m", "\x1b[22m")


def add_chats_parser(commands: Any) -> None:
    """The ``chats`` subcommand and its own subcommands, on ``commands`` (argparse's
    subparsers action of the `specchat` parser)."""
    chats = commands.add_parser("chats", help="list, search, export and import saved chats")
    actions = chats.add_subparsers(dest="chats_action", metavar="ACTION", required=True)
    actions.add_parser("list", help="every chat, the most recently used first")
    search = actions.add_parser("search", help="the messages of every chat that hold these words")
    search.add_argument("words", nargs="+", metavar="TEXT",
                        help="words to find (each may be the start of a longer word)")
    search.add_argument("--limit", type=arg_type(int, at_least(1), "positive_int"), default=50,
                        help="most hits shown (default 50)")
    export = actions.add_parser("export", help="one chat as Markdown or JSON")
    export.add_argument("chat_id", type=int, metavar="ID", help="the chat's id (see `list`)")
    export.add_argument("--format", dest="export_format", choices=("md", "json"), default="md",
                        help="md (to read, the default) or json (to import elsewhere)")
    export.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="write to FILE (default: stdout)")
    load = actions.add_parser("import", help="a new chat from a JSON export")
    load.add_argument("file", type=Path, help="a file written by `export --format json`")
    rename = actions.add_parser("rename", help="give a chat another title")
    rename.add_argument("chat_id", type=int, metavar="ID", help="the chat's id (see `list`)")
    rename.add_argument("title", help="the new title")


def chats_command(args: argparse.Namespace, history: Path | None = None) -> int:
    """Run `specchat chats ACTION` on the history at ``history`` (None: the user's)."""
    from chatapp.chat.chats import NoSuchChat, SavedChats

    try:
        with SavedChats.at(history) as chats:
            return _ACTIONS[args.chats_action](chats, args)
    except NoSuchChat as error:
        return _fail(f"{error} `specchat chats list` shows the chats and their ids.")
    except UserFacingError as error:
        return _fail(str(error))


def _fail(message: str) -> int:
    print(f"specchat chats: {message}", file=sys.stderr)
    return 1


def _list(chats: SavedChats, args: argparse.Namespace) -> int:
    from chatapp.chat.terminal_text import printable_line

    summaries = chats.list_chats()
    if not summaries:
        print("No saved chats yet.", file=sys.stderr)
        return 0
    print(f"{'ID':>5}  {'LAST USED':16}  {'MSGS':>4}  TITLE")
    for chat in summaries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated_at))
        title = printable_line(chat.title) or "(untitled)"
        print(f"{chat.id:>5}  {used:16}  {chat.message_count:>4}  {title}")
    return 0


def _search(chats: SavedChats, args: argparse.Namespace) -> int:
    from chatapp.chat.terminal_text import printable_line

    text = " ".join(args.words)
    if not any(char.isalnum() for char in text):
        return _fail("give at least one word to search for, e.g. `specchat chats search rename`")
    hits = chats.search(text, args.limit, _MARK)
    if not hits:
        return _fail(f"no message matches {text!r}.")
    bold = _BOLD if sys.stdout.isatty() else ("", "")
    roles = {"user": "you", "assistant": "assistant", "system": "system"}
    for hit in hits:
        title = printable_line(hit.title) or "(untitled)"
        line = printable_line(hit.snippet)
        line = line.replace(_MARK[0], bold[0]).replace(_MARK[1], bold[1])
        print(f"chat {hit.chat_id}, message {hit.message_id} ({roles[hit.role]}): {title}")
        print(f"    {line}")
    return 0


def _export(chats: SavedChats, args: argparse.Namespace) -> int:
    from chatapp.chat.terminal_text import printable

    text = chats.export(args.chat_id, args.export_format)
    if args.output is None:
        sys.stdout.write(printable(text) if sys.stdout.isatty() else text)
        return 0
    try:
        write_private(args.output, text.encode("utf-8"))
    except OSError as error:
        return _fail(f"cannot write {args.output}: {error.strerror or error}.")
    print(f"Chat {args.chat_id} written to {args.output}.", file=sys.stderr)
    return 0


def _import(chats: SavedChats, args: argparse.Namespace) -> int:
    from chatapp.chat.chat_file import MAX_FILE_BYTES
    from chatapp.chat.chats import ChatFileError
    from chatapp.chat.terminal_text import printable_line

    try:
        text = read_regular(args.file, MAX_FILE_BYTES).decode("utf-8")
    except NotRegularFile:
        return _fail(f"cannot read {args.file}: it is not a regular file (a chat export is).")
    except FileTooLarge:
        return _fail(f"cannot read {args.file}: it is over {MAX_FILE_BYTES // 2**20} MiB, "
                     "more than a chat export holds.")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "it is not UTF-8 text"
        return _fail(f"cannot read {args.file}: {reason or error}.")
    try:
        chat_id = chats.import_json(text)
    except ChatFileError as error:
        return _fail(f"cannot import {args.file}: {error}. Export a chat with "
                     "`specchat chats export ID --format json` to make a file that imports.")
    title = printable_line(chats.get(chat_id).title) or "(untitled)"
    print(f"Imported {args.file} as chat {chat_id}: {title}")
    return 0


def _rename(chats: SavedChats, args: argparse.Namespace) -> int:
    chats.rename(args.chat_id, args.title)
    print(f"Chat {args.chat_id} renamed.", file=sys.stderr)
    return 0


_ACTIONS = {"list": _list, "search": _search, "export": _export, "import": _import,
            "rename": _rename}
