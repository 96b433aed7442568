"""The event stream the engine yields; the TUI, the CLI and the bench consume only these.

A ``PromptProgressEvent`` after each chunk of a long prompt (one longer than a chunk to evaluate:
``chatapp.engine.loop.PROMPT_CHUNK``), a ``PromptEvent`` once the prompt is evaluated, one
``TokenEvent`` per emitted token, one
``StepEvent`` per target forward (a speculation step, or a plain decoding step when nothing was
drafted) with the turn's running statistics and its draft length as numbers, and a final
``DoneEvent`` with the turn's statistics. The engine measures; consumers only read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from chatapp.engine.stats import TurnStats


class TokenSource(str, Enum):
    """Where an emitted token came from."""

    ACCEPTED = "accepted"  # drafted, and accepted by the target
    RESAMPLED = "resampled"  # drawn by the target from the residual after a rejected draft
    BONUS = "bonus"  # drawn by the target after every draft of the step was accepted
    TARGET = "target"  # plain target decoding (no draft this step)


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class PromptProgressEvent:
    """``done`` of the ``total`` prompt tokens that were not cached are evaluated (a long
    prompt is read in chunks; the reply may be cancelled between two)."""

    done: int
    total: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "prompt_progress", **asdict(self)}


@dataclass(frozen=True)
class PromptEvent:
    """The prompt's ``tokens`` not already cached were evaluated in ``seconds`` (before any reply
    token)."""

    tokens: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"type": "prompt", **asdict(self)}


@dataclass(frozen=True)
class TokenEvent:
    """``text`` is streaming-safe: "" while the token ends inside an incomplete UTF-8 character."""

    id: int
    text: str
    source: TokenSource
    step: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "token", "id": self.id, "text": self.text,
                "source": self.source.value, "step": self.step}


@dataclass(frozen=True)
class StepEvent:
    """One target forward. ``source`` proposed ``drafted`` tokens within a budget of ``k``, of
    which ``accepted`` were accepted; a plain step (nothing drafted) has k = 0 and source "".
    ``adaptive``: the policy chooses K itself (an auto policy), so ``k`` is its choice of the
    moment, not the user's. ``stats``: the turn's statistics up to the end of this step, as the
    engine measured them (total time and time to first token included)."""

    step: int
    k: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    source: str
    adaptive: bool
    stats: TurnStats

    def to_json(self) -> dict[str, Any]:
        return {"type": "step", "step": self.step, "k": self.k, "drafted": self.drafted,
                "accepted": self.accepted, "draft_s": self.draft_s, "verify_s": self.verify_s,
                "source": self.source, "adaptive": self.adaptive, "stats": self.stats.to_json()}


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: FinishReason
    stats: TurnStats

    def to_json(self) -> dict[str, Any]:
        return {"type": "done", "finish_reason": self.finish_reason.value,
                "stats": self.stats.to_json()}


Event = PromptProgressEvent | PromptEvent | TokenEvent | StepEvent | DoneEvent
