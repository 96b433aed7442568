"""Messages the worker threads post (``post_message`` is thread-safe): the model loader's, which
bubble up to the app, and a reply's or a replay's, which stay with the chat view that runs it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from textual.message import Message

from chatapp.chat.events import ReplayStats, StepEvent, TokenEvent
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import ChatEvent, ReplayJob, Turn
from chatapp.tui.errors import describe_error


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
    """Events of a reply's stream, in order: the plan, the prompt, the steps since the last
    message (their tokens and ``StepEvent``s: never one message per character) or the end (with
    the ``DoneEvent``)."""

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


def post_reply(events: Iterable[ChatEvent], turn: Turn, post: Callable[[Message], object],
               cancelled: Callable[[], bool], interval_s: float = 0.0) -> None:
    """(A worker thread.) ``post`` the ``events`` of ``turn``'s stream in order, in batches:
    the plan and the prompt at once; the steps' tokens with their ``StepEvent``s, the first step
    at once, then at most once every ``interval_s`` seconds (a step that ends sooner after the
    last step posted waits for a later one: each message wakes the app's thread, and the app
    shows text at most that often anyway); the end at once; a failure (``ReplyFailed``)
    after the events before it. ``cancelled()`` True stops the turn."""
    batch: list[ChatEvent] = []
    posted = -interval_s
    try:
        for event in events:
            if cancelled():
                turn.cancel.set()
            batch.append(event)
            if isinstance(event, TokenEvent):
                continue
            if not isinstance(event, StepEvent):
                post(ReplyEvents(turn, batch))
                batch = []
            elif (now := time.monotonic()) - posted >= interval_s:
                post(ReplyEvents(turn, batch))
                batch, posted = [], now
    except Exception as error:  # shown in the app; the typed text goes back to the input
        if batch:
            post(ReplyEvents(turn, batch))
        text = describe_error(error)
        if turn.not_sent:
            text = (f"Your message was not sent. {text} (In the app: Settings, F4, "
                    "Context.) Your message is back in the message box.")
        post(ReplyFailed(turn, text))


class ReplayDone(Message):
    """A replay at K = 0 ended: ``result`` None when it was stopped, ``error`` when it failed."""

    bubble = False

    def __init__(self, job: ReplayJob, result: ReplayStats | None, error: str = "") -> None:
        super().__init__()
        self.job = job
        self.result = result
        self.error = error
