"""The records of a conversation: its messages (``ChatEntry``), a reply being made (``Turn``),
the plan of a turn's prompt (``PlanEvent``) and a replay at K = 0 (``ReplayJob``).

Plain data with the arithmetic that belongs to it (a turn's live statistics, its K label); they
are made and changed by ``chatapp.chat.conversation.Conversation`` and read by the front ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from chatapp.backends.chat_template import ChatMessage
from chatapp.chat.history import StoredMessage
from chatapp.engine.events import Event, PromptEvent, StepEvent, TokenSource
from chatapp.engine.stats import ReplayStats, StatsRecorder, TurnStats

Piece = tuple[str, TokenSource]


@dataclass(eq=False)
class ChatEntry:
    """One message of the open chat, as saved (``message_id`` None: not in the history)."""

    role: str
    content: str
    message_id: int | None = None
    pieces: list[Piece] | None = None
    stats: TurnStats | None = None
    finish_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_stored(cls, message: StoredMessage) -> "ChatEntry":
        return cls(message.role, message.content, message.id, message.runs, message.stats,
                   message.finish_reason, dict(message.meta))

    @property
    def k_label(self) -> str:
        return str(self.meta.get("k", ""))

    @property
    def target_rpc(self) -> tuple[str, ...]:
        return tuple(self.meta.get("target_rpc", ()))

    @property
    def replay(self) -> ReplayStats | None:
        """The K = 0 replay's measurement of this reply, once the user asked for it."""
        data = self.meta.get("replay")
        return ReplayStats.from_json(data) if data else None


@dataclass(frozen=True)
class PlanEvent:
    """A turn's prompt is planned: the ``dropped_messages`` oldest messages were left out so that
    it fits the context window; ``note``: what to tell the user about it once, else ""."""

    prompt_tokens: int
    dropped_messages: int
    note: str = ""


ChatEvent = PlanEvent | Event


@dataclass(eq=False)
class Turn:
    """One assistant reply being made. Filled on the front end's thread, step by step."""

    messages: list[ChatMessage]  # the conversation sent to the models, the user turn last
    user_text: str
    started_at: float
    chat_id: int | None = None
    epoch: int = 0  # which opened chat the turn belongs to (see ``Conversation.is_current``)
    user_entry: ChatEntry | None = None  # the user message this turn added (None: regenerated)
    replaces: ChatEntry | None = None  # the reply a regeneration replaces once it is done
    meta: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    pieces: list[Piece] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    recorder: StatsRecorder = field(default_factory=StatsRecorder)
    first_token_at: float | None = None
    final_stats: TurnStats | None = None
    finish_reason: str | None = None
    k_start: str = ""  # the draft policy's label when the reply started
    not_sent: bool = False  # the message did not fit the context: nothing was generated
    saved: bool = False

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add_prompt(self, prompt: PromptEvent) -> None:
        """The engine's report of the prompt's evaluation: the live statistics show it."""
        self.recorder.prompt_s = prompt.seconds

    def add_step(self, pieces: list[Piece], step: StepEvent | None, now: float) -> None:
        """The tokens of one step (``step`` None: the last tokens before the end)."""
        self.pieces.extend(pieces)
        if pieces and self.first_token_at is None:
            self.first_token_at = now
        self.recorder.tokens += len(pieces)
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
        ks = [step.k for step in self.steps]
        if not ks:
            return self.k_start
        if not self.k_start.isdigit():  # an adaptive policy: the range of K it chose
            name = self.k_start.split("(")[0]
            low, high = min(ks), max(ks)
            return f"{name} {low}" if low == high else f"{name} {low}–{high}"
        if min(ks) == max(ks) == int(self.k_start):
            return self.k_start
        return f"{self.k_start}→{ks[-1]}"

    @property
    def last_k(self) -> int | None:
        return self.steps[-1].k if self.steps else None


@dataclass(eq=False)
class ReplayJob:
    """A reply to decode again at K = 0: its prompt, its length and its own speed."""

    entry: ChatEntry
    messages: list[ChatMessage]
    tokens: int
    speculative_tps: float
    cancel: threading.Event = field(default_factory=threading.Event)
