"""A chat as a JSON file, to move it between machines: ``chat_to_json`` writes one,
``chat_from_json`` reads one back, refusing anything malformed with a ``ChatFileError`` that says
what is wrong.

The file (``FORMAT``, ``VERSION``)::

    {"format": "specchat-chat", "version": 1, "title": ..., "draft": ..., "target": ...,
     "created_at": <Unix seconds>, "settings": ChatSettings.to_json() | null, "messages": [
        {"role": "user" | "assistant" | "system", "content": ..., "created_at": ...,
         "runs": [[text, source], ...] | null, "finish_reason": ... | null,
         "stats": TurnStats.to_json() | null, "meta": {...},
         "attachments": [{"path": ..., "language": ..., "text": ...}, ...]}, ...]}

``runs`` is the reply's token provenance (sources as ``TokenSource`` values), ``stats`` the turn's
statistics and ``meta`` the settings the reply was made with (K, sampling, models), as the history
holds them; ``attachments`` the files sent with a user message (may be left out when none).
``settings`` are those the chat goes on with (its preset's name, sampling, K...); a file written
before chats kept them has none, and its chat is answered with the settings in force.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from chatapp.chat.attachments import Attachment
from chatapp.chat.chat_settings import ChatSettings
from chatapp.chat.history import ChatSummary, StoredMessage
from chatapp.chat.reply_values import DraftLengthUse, Ending
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import ReplayStats, TurnStats
from chatapp.errors import UserFacingError

FORMAT = "specchat-chat"
VERSION = 1
ROLES = ("system", "user", "assistant")
FINISH_REASONS = tuple(ending.value for ending in Ending)
MAX_NUMBER = 1e15  # times (Unix seconds), counts and durations are far below it
MAX_FILE_BYTES = 64 * 1024 * 1024  # the largest chat file ``chats import`` reads


class ChatFileError(UserFacingError, ValueError):
    """A chat file that cannot be imported; the message says what is wrong with it."""


def chat_to_json(chat: ChatSummary, messages: Sequence[StoredMessage]) -> dict[str, Any]:
    """``chat`` and its ``messages`` as the file's JSON object."""
    return {
        "format": FORMAT, "version": VERSION, "title": chat.title, "draft": chat.draft,
        "target": chat.target, "created_at": chat.created_at,
        "settings": chat.settings.to_json() if chat.settings is not None else None,
        "messages": [_message_json(message) for message in messages],
    }


def _message_json(message: StoredMessage) -> dict[str, Any]:
    return {
        "role": message.role, "content": message.content, "created_at": message.created_at,
        "runs": ([[text, source.value] for text, source in message.runs]
                 if message.runs is not None else None),
        "finish_reason": message.finish_reason,
        "stats": message.stats.to_json() if message.stats is not None else None,
        "meta": message.meta,
        "attachments": [attachment.to_json() for attachment in message.attachments],
    }


def chat_from_json(text: str) -> tuple[ChatSummary, list[StoredMessage]]:
    """The chat (id and counts 0) and its messages (ids 0) in the file's text ``text``.

    Raises ``ChatFileError`` for text that is not JSON, another format, another version, a
    field missing or of the wrong type, a number out of range or a text that is not Unicode
    (a lone surrogate), naming the message and the field; never anything else."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ChatFileError(f"it is not JSON ({error})") from None
    _check_texts(data)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatFileError(f'it is not a specchat chat (no "format": "{FORMAT}")')
    version = data.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise ChatFileError(f"it is version {version!r} of the chat format and this specchat "
                            f"reads version {VERSION}"
                            + (": a newer specchat wrote it, upgrade to import it" if newer
                               else ""))
    chat = ChatSummary(0, _field(data, "title", str), _field(data, "draft", str),
                       _field(data, "target", str), _number(data, "created_at"),
                       _number(data, "created_at"), 0, _settings(data.get("settings")))
    messages = _field(data, "messages", list)
    return chat, [_message(item, number) for number, item in enumerate(messages, 1)]


def _message(data: Any, number: int) -> StoredMessage:
    where = f"message {number}"
    if not isinstance(data, dict):
        raise ChatFileError(f"{where} is not an object")
    role = _field(data, "role", str, where)
    if role not in ROLES:
        raise ChatFileError(f"{where} has the role {role!r} (one of {', '.join(ROLES)})")
    finish_reason = _field(data, "finish_reason", (str, type(None)), where)
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        raise ChatFileError(f"{where} has the finish reason {finish_reason!r}")
    content = _field(data, "content", str, where)
    return StoredMessage(
        id=0, chat_id=0, role=role, content=content,
        created_at=_number(data, "created_at", where),
        runs=_runs(data.get("runs"), content, where),
        finish_reason=finish_reason, stats=_stats(data.get("stats"), where),
        meta=_meta(_field(data, "meta", dict, where), where),
        attachments=_attachments(data.get("attachments", []), where))


def _meta(meta: dict[str, Any], where: str) -> dict[str, Any]:
    """``meta`` when the entries the front ends read are of their types (free-form otherwise)."""
    replay = meta.get("replay")
    try:
        if replay is not None:
            ReplayStats.from_json(replay)
        rpc = meta.get("target_rpc", [])
        k = meta.get("k", "")
        if isinstance(k, dict):
            DraftLengthUse.from_json(k)  # K as numbers; a str or int: a chat saved before
        elif not isinstance(k, (str, int)):
            raise ValueError(where)
        if not isinstance(rpc, list) or not all(isinstance(endpoint, str) for endpoint in rpc):
            raise ValueError(where)
    except (TypeError, ValueError, KeyError):
        raise ChatFileError(f'{where} has a "meta" whose "k", "target_rpc" or "replay" is not '
                            "what specchat writes there") from None
    return meta


def _settings(data: Any) -> ChatSettings | None:
    try:
        return ChatSettings.from_json(data) if data is not None else None
    except ValueError as error:
        raise ChatFileError(f"the chat has settings specchat cannot use: {error}") from None


def _attachments(data: Any, where: str) -> tuple[Attachment, ...]:
    try:
        if not isinstance(data, list):
            raise ValueError("not a list")
        return tuple(Attachment.from_json(item) for item in data)
    except ValueError:
        raise ChatFileError(f'{where} has "attachments" that are not a list of objects with a '
                            '"path", a "language" and a "text"') from None


def _runs(data: Any, content: str, where: str) -> list[tuple[str, TokenSource]] | None:
    if data is None:
        return None
    sources = ", ".join(source.value for source in TokenSource)
    runs = []
    for run in data if isinstance(data, list) else [data]:
        if not (isinstance(run, list) and len(run) == 2 and isinstance(run[0], str)
                and run[1] in {source.value for source in TokenSource}):
            raise ChatFileError(f'{where} has "runs" that are not [text, source] pairs with a '
                                f"source among {sources}")
        runs.append((run[0], TokenSource(run[1])))
    if "".join(text for text, _ in runs) != content:
        raise ChatFileError(f'{where} has "runs" whose text is not its "content"')
    return runs


def _stats(data: Any, where: str) -> TurnStats | None:
    if data is None:
        return None
    wrong = ChatFileError(f'{where} has "stats" that are not a turn\'s statistics')
    if not isinstance(data, dict) or not isinstance(data.get("per_position_accepted", []), list):
        raise wrong
    try:
        stats = TurnStats.from_json(data)
    except TypeError:
        raise wrong from None
    figures = asdict(stats)
    numbers = list(figures.pop("per_position_accepted")) + list(figures.values())
    if not all(_in_range(n) for n in numbers):
        raise wrong
    return stats


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...],
           where: str = "the chat") -> Any:
    if name not in data:
        raise ChatFileError(f'{where} has no "{name}"')
    value = data[name]
    if not isinstance(value, kind):
        raise ChatFileError(f'{where} has a "{name}" of the wrong type ({type(value).__name__})')
    return value


def _number(data: dict[str, Any], name: str, where: str = "the chat") -> float:
    value = _field(data, name, (int, float), where)
    if not _in_range(value):
        raise ChatFileError(f'{where} has a "{name}" that is not a number within '
                            f"±{MAX_NUMBER:.0e}")
    return float(value)


def _in_range(value: Any) -> bool:
    """A number (no bool) that is finite and within ``MAX_NUMBER`` of 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -MAX_NUMBER <= value <= MAX_NUMBER and not math.isnan(value)


def _check_texts(data: Any) -> None:
    """Refuse a text (a value or a key) that is not valid Unicode (JSON's ``\\ud800``: a lone
    surrogate, which the history cannot store), naming where it is."""
    stack: list[tuple[Any, str]] = [(data, "the chat")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ChatFileError(f"{where} holds a text that is not valid Unicode (a lone "
                                    "surrogate)") from None
        elif isinstance(value, dict):
            stack.extend((key, f"{where}, a key") for key in value)
            stack.extend((item, f'{where}, "{_shown_key(key)}"') for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, f"{where}, item {number}")
                         for number, item in enumerate(value, 1))


def _shown_key(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:40]
