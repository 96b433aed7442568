"""Messages the worker threads post (``post_message`` is thread-safe): the model loader's, which
bubble up to the app, and a reply's or a replay's, which stay with the chat view that runs it."""

from __future__ import annotations

from textual.message import Message

from chatapp.chat.events import ReplayStats
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import ChatEvent, ReplayJob, Turn


class LoadProgress(Message):
    def __init__(self, text: str, fraction: float | None, generation: int) -> None:
        super().__init__()
        self.text = text
        self.fraction = fraction
        self.generation = generation


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

    bubble = False

    def __init__(self, turn: Turn, events: list[ChatEvent]) -> None:
        super().__init__()
        self.turn = turn
        self.events = events


class ReplyFailed(Message):
    bubble = False

    def __init__(self, turn: Turn, error: str) -> None:
        super().__init__()
        self.turn = turn
        self.error = error


class ReplayDone(Message):
    """A replay at K = 0 ended: ``result`` None when it was stopped, ``error`` when it failed."""

    bubble = False

    def __init__(self, job: ReplayJob, result: ReplayStats | None, error: str = "") -> None:
        super().__init__()
        self.job = job
        self.result = result
        self.error = error
