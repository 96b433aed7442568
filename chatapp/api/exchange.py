"""One stateless exchange at a time over the loaded pair, for the API server: messages in, events
out, on the same session, engine and drafter as the chat app.

Unlike a ``Conversation`` it keeps no chat: each request brings the whole conversation, with its
own sampling settings, stop sequences and, optionally, a predicted output. Its reply goes through
the one pipeline, ``ChatSession.reply``, with the API's prompt rules (``REFUSE_TOO_LONG``: the
request's messages, the configured system prompt first when the request has none, never trimmed:
a prompt that leaves no room for a reply raises ``PromptTooLongError``). The predicted output
travels in the reply's hints (``DraftHints.predicted``) and becomes a source of the default
drafter for that reply only (``chatapp.drafters.prediction``), verified like every other; the
reply's text goes into the drafter's suffix index under a key of its own
(``chatapp.api.served``), and into the history only with ``save``. A raw completion (the
completions API: ``ExchangeRequest.raw``, a ``RawText`` prompt and perhaps a suffix to fill in
before) goes through the same pipeline under those prompt rules instead, and is not saved: the
history holds conversations. One draft length handle
(``DraftLength``) lives across exchanges and starts from what the last run on this machine and
pair measured, as the app's does.

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
from dataclasses import dataclass, field, replace

from chatapp.api.served import ServedChats
from chatapp.api.stops import Piece, StopScanner
from chatapp.assembly.loader import LoadProgress, build_session
from chatapp.chat.history import HistoryError, HistoryStore
from chatapp.chat.message import ChatMessage
from chatapp.chat.prompt import (
    REFUSE_TOO_LONG,
    FimUnsupportedError,
    PromptRules,
    PromptTooLongError,
    RawText,
)
from chatapp.chat.reply_grammar import ReplyGrammar
from chatapp.chat.reply_settings import policy_setting
from chatapp.chat.reply_values import DraftLengthUse, Ending
from chatapp.chat.session import ChatSession, ReplyOverrides
from chatapp.chat.tools import NO_TOOLS, Tools
from chatapp.engine.contracts import source_family
from chatapp.engine.events import DoneEvent, StepEvent, TokenEvent
from chatapp.engine.stats import SourceTally, TurnStats
from chatapp.errors import UserFacingError
from chatapp.grammar.matcher import GrammarError
from chatapp.policy.draft_length import DraftLength
from chatapp.settings.config import Config
from chatapp.text_budget import PromptCancelled, PromptOverLimit

SessionFactory = Callable[[Config, LoadProgress], ChatSession]
__all__ = ["ChatExchange", "ExchangeDone", "ExchangeRequest", "ExchangeResult", "ExchangeStarted",
           "FimUnsupportedError", "GrammarError", "PredictionTooLongError", "PromptCancelled",
           "PromptTooLongError", "RawText", "ReplyDelta", "ReplyGrammar", "SourceTally",
           "open_exchange"]
log = logging.getLogger(__name__)


class PredictionTooLongError(UserFacingError):
    """The predicted output is longer than the context window."""

    def __init__(self, n_ctx: int) -> None:
        super().__init__(
            f"The prediction is longer than the context window ({n_ctx} tokens): no reply could "
            "use all of it. Send a shorter prediction.")


@dataclass(frozen=True)
class ExchangeRequest:
    """One request; None fields take the server's settings (``max_tokens``
    ``UNTIL_CONTEXT_END``: the reply may run to the end of the window); ``tools``: the declared
    functions and the choice among them (their calls are read from the reply's text by
    ``chatapp.api.tool_calls``); ``grammar``: what the reply must match; ``raw``: a raw
    completion's prompt (then ``messages`` is empty)."""

    messages: tuple[ChatMessage, ...]
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    prediction: str | None = None
    grammar: ReplyGrammar | None = None
    tools: Tools = NO_TOOLS
    min_p: float | None = None
    raw: RawText | None = None

    @property
    def rules(self) -> PromptRules:
        """The prompt rules of the request: its raw text's, else the API's for messages."""
        return self.raw if self.raw is not None else REFUSE_TOO_LONG

    @property
    def overrides(self) -> ReplyOverrides:
        return ReplyOverrides(self.temperature, self.top_p, self.top_k, self.max_tokens,
                              self.seed, self.grammar, self.tools, self.min_p)


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


@dataclass(frozen=True)
class ExchangeResult:
    """The reply and its figures. ``finish_reason``: ``STOP`` (the model's end or a stop
    sequence), ``LENGTH`` or ``CANCELLED``; ``k``: the draft length it used; ``stats``: the
    engine's; ``sources``: drafting per source family; ``prediction_tokens``: the predicted
    output's length in tokens (None: no prediction), of which ``accepted_prediction`` appear in
    the reply (in order) and ``rejected_prediction`` do not; ``prediction_used``: the drafter
    took it as a source (the default drafter does; the draft model alone does not);
    ``not_saved``: why the history could not keep the reply ("" when it did, or was not asked
    to)."""

    text: str
    finish_reason: Ending
    stats: TurnStats
    k: DraftLengthUse
    sources: dict[str, SourceTally] = field(default_factory=dict)
    prediction_tokens: int | None = None
    accepted_prediction: int = 0
    rejected_prediction: int = 0
    prediction_used: bool = False
    not_saved: str = ""


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
        self.policy = DraftLength(policy_setting(config))
        self.policy.models_loaded(policy_setting(config))
        self.served = ServedChats(history, config.draft, config.target)

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    def close(self) -> None:
        """Keep what the policy learnt, close the history and free the models."""
        self.policy.remember(policy_setting(self.config))
        self.served.close()
        self.session.close()

    def run(self, request: ExchangeRequest, cancel: threading.Event) -> Iterator[ExchangeEvent]:
        """(Worker thread.) The exchange's events; setting ``cancel`` ends the reply after the
        step under way (finish reason "cancelled"), or stops the tokenization of its prompt or
        prediction with ``PromptCancelled``."""
        predicted = self._predicted(request, cancel)
        chat, hints = self.served.hints(request.messages, predicted or ())
        plan, events = self.session.reply(request.messages, self.policy, rules=request.rules,
                                          overrides=request.overrides, hints=hints,
                                          cancel=cancel)
        self.served.begin(hints)
        yield ExchangeStarted(len(plan.tokens), plan.note)
        reply = _Reply(StopScanner(request.stop),
                       DraftLengthUse(self.policy.adaptive, self.policy.current_k()))
        try:
            for event in events:
                delta = reply.take(event, cancel)
                if delta is not None:
                    yield delta
        finally:
            events.close()
        held = reply.stops.flush()
        if held:
            reply.pieces.extend(held)
            yield ReplyDelta(tuple(held))
        result = reply.result(predicted, self.session.takes_prediction)
        not_saved = self._keep(request, chat, reply, result)
        yield ExchangeDone(replace(result, not_saved=not_saved))

    def _keep(self, request: ExchangeRequest, chat: int | None, reply: "_Reply",
              result: ExchangeResult) -> str:
        """Save the exchange (with a history) and what the policy learnt. A reply that
        finished is answered even when the history cannot save it: the failure is logged and
        returned (what to tell the client), else ""."""
        meta = {"k": result.k.to_json(), "draft": self.config.draft,
                "target": self.config.target, "api": True}
        not_saved = ""
        try:
            if request.raw is None:
                self.served.save(request.messages, chat, result.text, reply.pieces,
                                 result.stats, result.finish_reason, meta)
        except (HistoryError, sqlite3.Error, OSError) as error:
            log.warning("The reply was answered but not saved to the history: %s", error)
            not_saved = f"The reply was not saved to the history: {error}"
        if result.finish_reason is not Ending.CANCELLED:
            self.policy.remember(policy_setting(self.config))
        return not_saved

    def _predicted(self, request: ExchangeRequest, cancel: threading.Event) -> list[int] | None:
        """The predicted output's tokens (plain text; None without one);
        ``PredictionTooLongError`` as soon as they are known not to fit the context window."""
        if not request.prediction:
            return None
        try:
            return self.session.tokenize(request.prediction, self.session.n_ctx, cancel)
        except PromptOverLimit:
            raise PredictionTooLongError(self.session.n_ctx) from None


class _Reply:
    """What one exchange's engine events made so far: the pieces shown, the token ids, the
    drafting per source family, and how it ended."""

    def __init__(self, stops: StopScanner, k: DraftLengthUse) -> None:
        self.stops = stops
        self.k = k
        self.ks: list[int] = []  # each step's K
        self.pieces: list[Piece] = []
        self.ids: list[int] = []
        self.sources: dict[str, SourceTally] = {}
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
        elif isinstance(event, StepEvent):
            self.ks.append(event.k)
            if not event.drafted:
                return None
            self.sources.setdefault(source_family(event.source), SourceTally()).add(
                event.drafted, event.accepted, event.draft_s)
        elif isinstance(event, DoneEvent):
            self.done = event
        return None

    def result(self, predicted: list[int] | None, prediction_used: bool) -> ExchangeResult:
        done = self.done
        stats = done.stats if done is not None else TurnStats()
        reason = Ending.STOP if self.stops.matched else (
            Ending.of(done.finish_reason) if done is not None else Ending.CANCELLED)
        text = "".join(text for text, _ in self.pieces)
        k = DraftLengthUse.of_steps(self.k.adaptive, self.k.start, self.ks)
        if predicted is None:
            return ExchangeResult(text, reason, stats, k, self.sources)
        accepted = prediction_overlap(predicted, self.ids)
        return ExchangeResult(text, reason, stats, k, self.sources, len(predicted), accepted,
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
                                     history=history)
    except BaseException:
        if history is not None:
            history.close()
        raise
    return ChatExchange(session, config, history)
