"""Messages the worker threads post to the app (``post_message`` is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from chatapp.chat.events import PromptEvent, ReplayStats, StepEvent, TurnStats
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import Piece, PlanEvent, ReplayJob, Turn


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


class ReplyPlanned(Message):
    def __init__(self, turn: Turn, plan: PlanEvent) -> None:
        super().__init__()
        self.turn = turn
        self.plan = plan


class ReplyPrompt(Message):
    """The engine evaluated the reply's prompt."""

    def __init__(self, turn: Turn, prompt: PromptEvent) -> None:
        super().__init__()
        self.turn = turn
        self.prompt = prompt


class ReplyStep(Message):
    """The tokens of one speculation step (``step`` None: the last tokens before the end)."""

    def __init__(self, turn: Turn, pieces: list[Piece], step: StepEvent | None) -> None:
        super().__init__()
        self.turn = turn
        self.pieces = pieces
        self.step = step


class ReplyDone(Message):
    def __init__(self, turn: Turn, finish_reason: str, stats: TurnStats) -> None:
        super().__init__()
        self.turn = turn
        self.finish_reason = finish_reason
        self.stats = stats


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
