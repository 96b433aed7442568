"""Messages the worker threads post to the app (``post_message`` is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from chatapp.chat.events import ReplayStats
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import ChatEvent, ReplayJob, Turn


class LoadProgress(Message):
    def __init__(self, text: str, fraction: float | None) -> None:
        super().__init__()
        self.text = text
        self.fraction = fraction


class SessionLoaded(Message):
    def __init__(self, session: ChatSession, generation: int) -> None:
        super().__init__()
        self.session = session
        self.generation = generation


class LoadFailed(Message):
    def __init__(self, error: str, generation: int) -> None:
        super().__init__()
        self.error = error
        self.generation = generation


class ReplyEvents(Message):
    """Events of a reply's stream, in order: the plan, the prompt, one step (its tokens and its
    ``StepEvent``: never one message per character) or the end (with the ``DoneEvent``)."""

    def __init__(self, turn: Turn, events: list[ChatEvent]) -> None:
        super().__init__()
        self.turn = turn
        self.events = events


class ReplyFailed(Message):
    def __init__(self, turn: Turn, error: str) -> None:
        super().__init__()
        self.turn = turn
        self.error = error


class ReplayDone(Message):
    """A replay at K = 0 ended: ``result`` None when it was stopped, ``error`` when it failed."""

    def __init__(self, job: ReplayJob, result: ReplayStats | None, error: str = "") -> None:
        super().__init__()
        self.job = job
        self.result = result
        self.error = error
