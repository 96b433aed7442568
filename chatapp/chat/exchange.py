"""One stateless exchange at a time over the loaded pair, for the API server: messages in, events
out, on the same session, engine and drafter as the chat app.

Unlike a ``Conversation`` it keeps no chat: each request brings the whole conversation, with its
own sampling settings, stop sequences and, optionally, a predicted output. Its prompt is the
request's messages through the target's chat template (the configured system prompt first when the
request has none), never trimmed: a prompt that leaves no room for a reply raises
``PromptTooLongError``. The predicted output becomes a source of the default drafter for that
reply only (``chatapp.drafters.prediction``), verified like every other; the reply's text goes
into the drafter's suffix index under a key of its own (``chatapp.chat.served``), and into the
history only with ``save``. One draft policy lives across exchanges and starts from what the last
run on this machine and pair measured, as the app's does.

``ChatExchange.run`` is for the one worker thread that runs the models; it yields an
``ExchangeStarted`` once the prompt is planned (before any token: a refusal comes first), the
reply's ``ReplyDelta``s, and an ``ExchangeDone`` with the reply and its figures.
"""

from __future__ import annotations

import difflib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from chatapp.backends.chat_template import ChatMessage
from chatapp.backends.prompt_parts import PromptCancelled as PromptCancelled  # for front ends
from chatapp.backends.prompt_parts import PromptOverLimit, plain_tokens
from chatapp.chat.history import HistoryError, HistoryStore
from chatapp.chat.loader import LoadProgress, build_session, make_policy
from chatapp.chat.served import ServedChats
from chatapp.chat.session import MIN_REPLY_ROOM, ChatSession, fallback_template_note
from chatapp.chat.stops import Piece, StopScanner
from chatapp.drafters.combined import predicting_drafter
from chatapp.engine.contracts import source_family
from chatapp.engine.events import DoneEvent, FinishReason, StepEvent, TokenEvent
from chatapp.engine.loop import GenerationSettings
from chatapp.engine.sampling import SamplingParams
from chatapp.engine.stats import TurnStats
from chatapp.errors import UserFacingError
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.memory import memory_path, recall, remember
from chatapp.settings.config import Config

SessionFactory = Callable[[Config, LoadProgress], ChatSession]
log = logging.getLogger(__name__)


class PromptTooLongError(UserFacingError):
    """The request's messages leave no room for a reply in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int, room: int, at_least: bool = False
                 ) -> None:
        """``at_least``: the work stopped once ``prompt_tokens`` passed the limit."""
        super().__init__(
            f"The messages are {'more than ' if at_least else ''}{prompt_tokens} tokens with "
            "the chat template, and the context "
            f"window holds {n_ctx} with at least {room} kept for the reply. Send fewer or "
            "shorter messages, or start the server with a larger --n-ctx.")
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class PredictionTooLongError(UserFacingError):
    """The predicted output is longer than the room the prompt leaves in the context window."""

    def __init__(self, room: int) -> None:
        super().__init__(
            f"The prediction is longer than the {room} tokens the messages leave in the context "
            "window: no reply could use all of it. Send a shorter prediction.")


@dataclass(frozen=True)
class ExchangeRequest:
    """One request; None fields take the server's settings."""

    messages: tuple[ChatMessage, ...]
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    prediction: str | None = None


@dataclass(frozen=True)
class ExchangeStarted:
    """The prompt is planned (``prompt_tokens``); ``note``: what to tell the client once."""

    prompt_tokens: int
    note: str = ""


@dataclass(frozen=True)
class ReplyDelta:
    """More of the reply: its pieces (text, where the token came from), in order."""

    pieces: tuple[Piece, ...]

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)


@dataclass
class SourceCounts:
    """What one family of sources ("prediction", "edit", "suffix", "ngram", "model") drafted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class ExchangeResult:
    """The reply and its figures. ``finish_reason``: "stop" (the model's end or a stop
    sequence), "length" or "cancelled"; ``stats``: the engine's; ``sources``: drafting per
    source family; ``prediction_tokens``: the predicted output's length in tokens (None: no
    prediction), of which ``accepted_prediction`` appear in the reply (in order) and
    ``rejected_prediction`` do not; ``prediction_used``: the drafter took it as a source (the
    default drafter does; the draft model alone does not)."""

    text: str
    finish_reason: str
    stats: TurnStats
    sources: dict[str, SourceCounts] = field(default_factory=dict)
    prediction_tokens: int | None = None
    accepted_prediction: int = 0
    rejected_prediction: int = 0
    prediction_used: bool = False


@dataclass(frozen=True)
class ExchangeDone:
    result: ExchangeResult


ExchangeEvent = ExchangeStarted | ReplyDelta | ExchangeDone


def prediction_overlap(predicted: Sequence[int], reply: Sequence[int]) -> int:
    """How many of the ``predicted`` tokens appear in ``reply``, in order (matching blocks)."""
    matcher = difflib.SequenceMatcher(None, list(predicted), list(reply), autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


class ChatExchange:
    """Exchanges over ``session``'s models; see the module docstring."""

    def __init__(self, session: ChatSession, config: Config,
                 history: HistoryStore | None = None) -> None:
        self.session = session
        self.config = config
        self.policy = make_policy(config)
        self._memory = memory_path(config.measured_setup())
        if isinstance(self.policy, AutoDraftLength):
            recall(self.policy, self._memory)
        self.served = ServedChats(session.history_index, history, config.draft, config.target)
        self._told_fallback = False

    @property
    def n_ctx(self) -> int:
        return self.session.engine.target.n_ctx

    def close(self) -> None:
        """Keep what the policy learnt, close the history and free the models."""
        self._remember()
        self.served.close()
        self.session.close()

    def prompt(self, request: ExchangeRequest, cancel: threading.Event | None = None
               ) -> list[int]:
        """The prompt tokens of ``request``; ``PromptTooLongError`` as soon as no reply can fit
        (before any tokenization when there are more messages than the context has places),
        ``PromptCancelled`` once ``cancel`` is set."""
        messages = list(request.messages)
        system = self.session.system_prompt
        if system and not any(m.role == "system" for m in messages):
            messages.insert(0, ChatMessage("system", system))
        target = self.session.engine.target
        room = min(self.settings(request).max_tokens, MIN_REPLY_ROOM)
        limit = target.n_ctx - room
        if len(messages) > limit:
            raise PromptTooLongError(len(messages), target.n_ctx, room, at_least=True)
        try:
            return target.chat_prompt(messages, limit, cancel)
        except PromptOverLimit as over:
            raise PromptTooLongError(over.tokens, target.n_ctx, room, at_least=True) from None

    def prediction(self, request: ExchangeRequest, prompt_tokens: int,
                   cancel: threading.Event | None = None) -> list[int] | None:
        """The predicted output's tokens (plain text), None without one;
        ``PredictionTooLongError`` as soon as they are known not to fit beside the prompt."""
        if not request.prediction:
            return None
        target = self.session.engine.target
        room = target.n_ctx - prompt_tokens
        try:
            return plain_tokens(request.prediction, target.tokenize, room, cancel)
        except PromptOverLimit:
            raise PredictionTooLongError(room) from None

    def settings(self, request: ExchangeRequest) -> GenerationSettings:
        base = self.session.settings
        sampling = SamplingParams(
            base.sampling.temperature if request.temperature is None else request.temperature,
            base.sampling.top_k if request.top_k is None else request.top_k,
            base.sampling.top_p if request.top_p is None else request.top_p)
        return GenerationSettings(sampling, request.max_tokens or base.max_tokens)

    def run(self, request: ExchangeRequest, cancel: threading.Event) -> Iterator[ExchangeEvent]:
        """(Worker thread.) The exchange's events; setting ``cancel`` ends the reply after the
        step under way (finish reason "cancelled"), or stops the prompt's tokenization with
        ``PromptCancelled``."""
        tokens = self.prompt(request, cancel)
        predicted = self.prediction(request, len(tokens), cancel)
        yield ExchangeStarted(len(tokens), self._template_note())
        drafter = predicting_drafter(self.session.engine.drafter)
        chat = self.served.begin(request.messages)
        if drafter is not None:
            drafter.predict(predicted)
        reply = _Reply(StopScanner(request.stop))
        rng = np.random.default_rng(request.seed) if request.seed is not None else (
            self.session.rng)
        events = self.session.engine.generate(tokens, self.settings(request), rng, self.policy,
                                              cancel)
        try:
            for event in events:
                delta = reply.take(event, cancel)
                if delta is not None:
                    yield delta
        finally:
            events.close()
            if drafter is not None:
                drafter.predict(None)
        held = reply.stops.flush()
        if held:
            reply.pieces.extend(held)
            yield ReplyDelta(tuple(held))
        result = reply.result(predicted, drafter is not None)
        self._keep(request, chat, reply, result)
        yield ExchangeDone(result)

    def _keep(self, request: ExchangeRequest, chat: int | None, reply: "_Reply",
              result: ExchangeResult) -> None:
        """Save the exchange (with a history) and what the policy learnt. A reply that
        finished is answered even when the history cannot save it: the failure is logged."""
        meta = {"k": self.config.draft_length, "draft": self.config.draft,
                "target": self.config.target, "api": True}
        try:
            self.served.save(request.messages, chat, result.text, reply.pieces, result.stats,
                             result.finish_reason, meta)
        except (HistoryError, sqlite3.Error, OSError) as error:
            log.warning("The reply was answered but not saved to the history: %s", error)
        if result.finish_reason != "cancelled":
            self._remember()

    def _remember(self) -> None:
        if isinstance(self.policy, AutoDraftLength):
            remember(self.policy, self._memory)

    def _template_note(self) -> str:
        target = self.session.engine.target
        if not target.uses_fallback_template or self._told_fallback:
            return ""
        self._told_fallback = True
        return fallback_template_note(self.session.engine.target_name)


class _Reply:
    """What one exchange's engine events made so far: the pieces shown, the token ids, the
    drafting per source family, and how it ended."""

    def __init__(self, stops: StopScanner) -> None:
        self.stops = stops
        self.pieces: list[Piece] = []
        self.ids: list[int] = []
        self.sources: dict[str, SourceCounts] = {}
        self.done: DoneEvent | None = None

    def take(self, event: object, cancel: threading.Event) -> ReplyDelta | None:
        """Take in one engine event; the delta it makes visible, if any. A stop sequence
        ends the reply after the step under way (``cancel``)."""
        if isinstance(event, TokenEvent):
            self.ids.append(event.id)
            shown = self.stops.push((event.text, event.source))
            if self.stops.matched:
                cancel.set()
            if shown:
                self.pieces.extend(shown)
                return ReplyDelta(tuple(shown))
        elif isinstance(event, StepEvent) and event.drafted:
            counts = self.sources.setdefault(source_family(event.source), SourceCounts())
            counts.steps += 1
            counts.drafted += event.drafted
            counts.accepted += event.accepted
        elif isinstance(event, DoneEvent):
            self.done = event
        return None

    def result(self, predicted: list[int] | None, prediction_used: bool) -> ExchangeResult:
        done = self.done
        stats = done.stats if done is not None else TurnStats()
        reason = "stop" if self.stops.matched else (
            done.finish_reason.value if done is not None else FinishReason.CANCELLED.value)
        text = "".join(text for text, _ in self.pieces)
        if predicted is None:
            return ExchangeResult(text, reason, stats, self.sources)
        accepted = prediction_overlap(predicted, self.ids)
        return ExchangeResult(text, reason, stats, self.sources, len(predicted), accepted,
                              len(predicted) - accepted, prediction_used)


def open_exchange(config: Config, progress: LoadProgress, save: bool = False,
                  factory: SessionFactory | None = None) -> ChatExchange:
    """Load the models (with ``factory``, else as the app does) and return the exchange over
    them; with ``save``, exchanges are written to the chat history, whose chats the default
    drafter's suffix index covers. Call it on the thread that will run the exchanges."""
    history = HistoryStore() if save else None
    try:
        if factory is not None:
            session = factory(config, progress)
        else:
            session = build_session(config, progress, with_draft=config.draft_length != "0",
                                     history=history, keep_index=True)
    except BaseException:
        if history is not None:
            history.close()
        raise
    return ChatExchange(session, config, history)
