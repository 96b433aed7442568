"""The records of a conversation: its messages (``ChatEntry``), a reply being made (``Turn``),
the plan of a turn's prompt (``PlanEvent``) and a replay at K = 0 (``ReplayJob``).

Plain data with what belongs to it (a turn takes in its events: ``Turn.apply``; how it ended and
the K it used are values: ``chatapp.chat.reply_values``); they are made and changed by
``chatapp.chat.conversation.Conversation`` and read by the front ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from chatapp.chat.attachments import Attachment, message_text
from chatapp.chat.engine_time import ENGINE_BASIS, SHOWN_BASIS, EngineClock
from chatapp.chat.history import StoredMessage
from chatapp.chat.message import ChatMessage
from chatapp.chat.reply_values import DraftLengthUse, Ending, k_text
from chatapp.engine.events import (
    DoneEvent,
    Event,
    PromptEvent,
    PromptProgressEvent,
    StepEvent,
    TokenEvent,
    TokenSource,
)
from chatapp.engine.loop import GenerationSettings
from chatapp.engine.stats import ReplayStats, TurnStats
from chatapp.settings.config import Config

Piece = tuple[str, TokenSource]


@dataclass(eq=False)
class ChatEntry:
    """One message of the open chat, as saved (``message_id`` None: not in the history)."""

    role: str
    content: str
    message_id: int | None = None
    pieces: list[Piece] | None = None
    stats: TurnStats | None = None
    finish_reason: Ending | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    attachments: tuple[Attachment, ...] = ()  # the files sent with a user message

    @classmethod
    def from_stored(cls, message: StoredMessage) -> "ChatEntry":
        ending = Ending(message.finish_reason) if message.finish_reason else None
        return cls(message.role, message.content, message.id, message.runs, message.stats,
                   ending, dict(message.meta), message.attachments)

    @property
    def sent_text(self) -> str:
        """The message as the models see it: its attachments, then its text."""
        return message_text(self.content, self.attachments)

    @property
    def k_label(self) -> str:
        """The draft length the reply used, as shown (``k_text``)."""
        return k_text(self.meta.get("k"))

    @property
    def target_rpc(self) -> tuple[str, ...]:
        return tuple(self.meta.get("target_rpc", ()))

    @property
    def replay(self) -> ReplayStats | None:
        """The K = 0 replay's measurement of this reply, once the user asked for it."""
        data = self.meta.get("replay")
        return ReplayStats.from_json(data) if data else None

    @property
    def engine_decode_tps(self) -> float | None:
        """A reply's decode rate in the engine (``EngineClock``); None for a reply saved before
        it was measured."""
        rate = self.meta.get("engine_decode_tps")
        return float(rate) if rate is not None else None

    @property
    def replay_basis(self) -> str:
        """What the replay's speedup compares (see ``engine_time``)."""
        return ENGINE_BASIS if self.engine_decode_tps is not None else SHOWN_BASIS


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
    """One assistant reply being made: what its events said so far, applied on the front end's
    thread (``apply``). It measures nothing: its statistics are the engine's."""

    messages: list[ChatMessage]  # the conversation sent to the models, the user turn last
    user_text: str
    chat_id: int | None = None
    epoch: int = 0  # which opened chat the turn belongs to (see ``Conversation.is_current``)
    user_entry: ChatEntry | None = None  # the user message this turn added (None: regenerated)
    replaces: ChatEntry | None = None  # the reply a regeneration replaces once it is done
    meta: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    k_start: int = 0  # the draft length in force when the reply started
    adaptive: bool = False  # whether the policy chose K itself when the reply started
    pieces: list[Piece] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    _stats: TurnStats = field(default_factory=TurnStats, init=False)  # the latest figures
    clock: EngineClock = field(default_factory=EngineClock)  # the stream's holding (``stream``)
    finish_reason: Ending | None = None
    not_sent: bool = False  # the message did not fit the context: nothing was generated
    reading: tuple[int, int] | None = None  # a long prompt being read: (done, of) its tokens
    saved: bool = False

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def apply(self, event: ChatEvent) -> None:
        """Take in one event of the turn's stream, in order: the plan and the prompt give the
        prompt's figures (a long prompt's progress ``reading`` until it is read), a token its
        text, a step the statistics the engine measured up to it,
        the end the final statistics and the finish reason."""
        if isinstance(event, TokenEvent):
            self.pieces.append((event.text, event.source))
        elif isinstance(event, StepEvent):
            self.steps.append(event)
            self._stats = event.stats
        elif isinstance(event, PlanEvent):
            self._stats = replace(self._stats, prompt_tokens=event.prompt_tokens)
        elif isinstance(event, PromptProgressEvent):
            self.reading = (event.done, event.total)
        elif isinstance(event, PromptEvent):
            self.reading = None
            self._stats = replace(self._stats, prompt_tokens=event.tokens,
                                  prompt_s=event.seconds)
        elif isinstance(event, DoneEvent):
            self._stats = event.stats
            self.finish_reason = Ending.of(event.finish_reason)

    def stats(self) -> TurnStats:
        """The engine's statistics as of the latest step (the final ones once done)."""
        return self._stats

    def k_use(self) -> DraftLengthUse:
        """The draft length the reply used, so far."""
        return DraftLengthUse.of_steps(self.adaptive, self.k_start,
                                       [step.k for step in self.steps])

    def k_label(self) -> str:
        """The draft length the reply used, as shown (``k_label``)."""
        return self.k_use().label

    @property
    def last_k(self) -> int | None:
        return self.steps[-1].k if self.steps else None


def turn_meta(settings: GenerationSettings, config: Config, k: DraftLengthUse) -> dict[str, Any]:
    """What a reply keeps of the settings it was made with: the draft length ``k`` (as numbers),
    the sampling, the longest reply, the models (and the target's RPC servers)."""
    return {"k": k.to_json(), "temperature": settings.sampling.temperature,
            "top_p": settings.sampling.top_p, "top_k": settings.sampling.top_k,
            "max_tokens": settings.max_tokens, "draft": config.draft,
            "target": config.target} | ({"target_rpc": list(config.rpc)} if config.rpc else {})


@dataclass(eq=False)
class ReplayJob:
    """A reply to decode again at K = 0: its prompt, its length and its own speed."""

    entry: ChatEntry
    messages: list[ChatMessage]
    tokens: int
    speculative_tps: float
    cancel: threading.Event = field(default_factory=threading.Event)
