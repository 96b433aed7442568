"""What the UI knows about one reply while it streams, built from the event stream alone."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from chatapp.backends.base import ChatMessage
from chatapp.events import StepEvent, TokenSource
from chatapp.stats import StatsRecorder, TurnStats

Piece = tuple[str, TokenSource]


@dataclass(eq=False)
class Turn:
    """One assistant reply. Filled on the UI thread from the worker's per-step messages."""

    messages: list[ChatMessage]  # the conversation sent to the session, the new user turn last
    user_text: str
    started_at: float
    chat_id: int | None = None
    user_message_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    pieces: list[Piece] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    recorder: StatsRecorder = field(default_factory=StatsRecorder)
    first_token_at: float | None = None
    final_stats: TurnStats | None = None
    finish_reason: str | None = None
    dropped_messages: int = 0
    epoch: int = 0  # which chat view the turn belongs to (the app bumps it on new/open chat)
    view: Any = None  # the MessageView showing the reply
    saved: bool = False  # the reply is in the history
    k_start: str = ""  # the draft policy's label when the reply started
    not_sent: bool = False  # the message did not fit the context: nothing was generated

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add_step(self, pieces: list[Piece], step: StepEvent | None, now: float) -> None:
        self.pieces.extend(pieces)
        emitted = sum(1 for _ in pieces)
        if emitted and self.first_token_at is None:
            self.first_token_at = now
        self.recorder.tokens += emitted
        if step is not None:
            self.steps.append(step)
            self.recorder.record_step(step.drafted, step.accepted, step.draft_s, step.verify_s)

    def stats(self, now: float) -> TurnStats:
        """The final statistics once done; until then a live estimate from the steps so far."""
        if self.final_stats is not None:
            return self.final_stats
        live = self.recorder.snapshot(max(0.0, now - self.started_at))
        ttft = self.first_token_at - self.started_at if self.first_token_at is not None else 0.0
        return replace(live, ttft_s=ttft)

    def k_label(self) -> str:
        """The draft length the reply used: the fixed K ("3"), "3→5" when the user changed it
        while the reply streamed, or for an adaptive policy the range it chose ("auto 2–5")."""
        start_label = self.k_start
        ks = [step.k for step in self.steps]
        if not ks:
            return start_label
        if not start_label.isdigit():  # an adaptive policy: the range of K it chose
            name = start_label.split("(")[0]
            low, high = min(ks), max(ks)
            return f"{name} {low}" if low == high else f"{name} {low}–{high}"
        if min(ks) == max(ks) == int(start_label):
            return start_label
        return f"{start_label}→{ks[-1]}"

    @property
    def last_k(self) -> int | None:
        return self.steps[-1].k if self.steps else None
