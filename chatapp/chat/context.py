"""The context window of the next turn: how much of it the prompt uses (``measure``, the front
ends' context meter) and what a turn that would not fit does (the ``overflow`` setting).

A prompt fits when its tokens and the room kept for the reply fit ``n_ctx``:
``ChatSession.reply_room`` is ``min(max_tokens, max(64, n_ctx // 4))`` tokens, so a long reply
is never cut to nothing by a full prompt and a short ``max_tokens`` does not waste the window.

``overflow`` (``chatapp.settings.options.OVERFLOWS``):

- ``"drop-oldest"`` (the default): the oldest whole turns (a user message and the replies after
  it) leave the prompt until it fits, never the system prompt and never the new message
  (``ChatSession.fit``); ``PlanEvent.dropped_messages`` / ``ContextUse.left_out`` say how many
  of the chat's messages the model no longer reads, and ``view_start_note`` is what the front
  ends show before the first one it reads.
- ``"refuse"``: ``check_room`` refuses the turn before anything is saved (``ContextFullError``:
  how many tokens are over and what to do); the front end keeps the typed text.

Either way a new message that does not fit even alone is the session's ``ContextOverflowError``
(the turn is rolled back): shortening it or a larger context is all that helps then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatapp.chat.attachments import Attachment, check_fits, message_text
from chatapp.chat.message import ChatMessage
from chatapp.errors import UserFacingError

if TYPE_CHECKING:
    from chatapp.chat.session import ChatSession

DROP_OLDEST = "drop-oldest"
# From this share of the window on (in percent), the meter warns (``ContextUse.warning``).
WARNING_PERCENT = 80


class ContextFullError(UserFacingError):
    """A turn refused under ``overflow = "refuse"``: the message says by how many tokens the
    prompt is over and what to do. Nothing was saved."""


@dataclass(frozen=True)
class ContextUse:
    """The next turn's prompt: ``used`` tokens of the ``n_ctx`` window (more than ``room``, the
    most a prompt may have, when it does not fit), with the chat's ``left_out`` oldest messages
    out of the model's view (drop-oldest)."""

    used: int
    n_ctx: int
    room: int
    left_out: int = 0

    @property
    def warning(self) -> bool:
        """Whether the prompt uses ``WARNING_PERCENT`` of the window or more."""
        return self.used * 100 >= WARNING_PERCENT * self.n_ctx

    @property
    def over(self) -> int:
        """Tokens by which the prompt is longer than ``room`` (0 when it fits)."""
        return max(0, self.used - self.room)


def measure(session: ChatSession, messages: Sequence[ChatMessage], overflow: str) -> ContextUse:
    """How much of the window the prompt of ``messages`` (the new message last) uses, as the
    turn would send it under ``overflow``: with drop-oldest, after leaving the oldest turns out
    (all but the new message, when even that alone is over); with refuse, the whole chat."""
    n_ctx, room = session.n_ctx, session.prompt_room
    history = [m for m in messages if m.role != "system"]
    if overflow == DROP_OLDEST:
        plan = session.fit(history)
        if plan is not None:
            return ContextUse(len(plan.tokens), n_ctx, room, plan.dropped_messages)
        return ContextUse(len(session.prompt(history[-1:])), n_ctx, room, len(history) - 1)
    return ContextUse(len(session.prompt(history)), n_ctx, room)


def check_room(session: ChatSession, messages: Sequence[ChatMessage], overflow: str) -> None:
    """Refuse, under ``overflow = "refuse"``, the turn whose prompt is ``messages`` (the new
    message last) when it would not fit: ``ContextFullError``. Nothing is refused under
    drop-oldest, nor when the new message does not fit even alone (the session's
    ``ContextOverflowError`` says what helps then)."""
    if overflow == DROP_OLDEST:
        return
    use = measure(session, messages, overflow)
    if not use.over or session.fit(messages[-1:]) is None:
        return
    raise ContextFullError(
        f"Not sent: the chat with your message needs {use.used:,} tokens, {use.over:,} more "
        f"than the {use.room:,} a prompt may have (the context window holds {use.n_ctx:,}, "
        f"{use.n_ctx - use.room:,} of them kept for the reply). Start a new chat, start "
        "specchat with a larger --n-ctx, or set overflow to drop-oldest (settings) to leave "
        "the oldest turns out of the model's view.")


def check_message(session: ChatSession, earlier: Sequence[ChatMessage], text: str,
                  attachments: Sequence[Attachment], overflow: str) -> None:
    """Refuse the user message ``text`` with ``attachments`` after the messages ``earlier``
    when its files would not fit (``check_fits``: ``AttachmentError``) or when the turn would
    not (``check_room``: ``ContextFullError``)."""
    check_fits(text, attachments, session.message_tokens, session.prompt_room)
    message = ChatMessage("user", message_text(text, attachments))
    check_room(session, [*earlier, message], overflow)


def view_start_note(left_out: int) -> str:
    """What the front ends show before the first message the model reads, when the
    ``left_out`` messages above it are out of its view."""
    above = "the message above is" if left_out == 1 else f"the {left_out} messages above are"
    return (f"Earlier messages are outside the model's view (context full): {above} left out "
            "of the prompt, the model reads the chat from here on. A larger context (--n-ctx) "
            "keeps more in view.")
