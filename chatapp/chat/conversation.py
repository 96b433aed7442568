"""One conversation end to end: its messages, their history rows, the turn lifecycle, the draft
length (``chatapp.policy.draft_length.DraftLength``), reconfiguring and closing the models.

The chat app and ``specchat run`` each hold one ``Conversation`` and only call it; they render
what it yields and never reach into the engine, the drafters, the backends or the history: the
saved chats are ``chats`` (``chatapp.chat.chats.SavedChats``: list, rename, delete, export).

A turn: ``begin`` (a new user message), ``regenerate`` (the last reply again) or ``edit`` (a past
user message changed, the later turns replaced) returns a ``Turn``. A synchronous caller
(``specchat run``, tests) hands it to ``run``, which does all that follows. A front end with a
worker thread iterates ``stream(turn)`` there (one ``PlanEvent``, then the engine's events),
applies every event in order with ``turn.apply`` on its own thread, and ends the turn with
``finish`` (done or stopped: the reply is saved) or ``fail`` (a reply with text is kept; one
without is rolled back and the front end gives the user's text back). ``prepare_replay`` and
``run_replay`` decode a reply again at K = 0 to measure its real speedup.

Threads: ``stream`` and ``run_replay`` only run the models and are for a worker thread; every
other method (``run`` included) runs on the caller's thread, the one that opened the history
(SQLite connections stay on their thread). A history write that fails is reported through
``on_write_error`` and never stops the chat.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chatapp.chat.attachments import Attachment, message_text
from chatapp.chat.chats import SavedChats
from chatapp.chat.context import ContextUse, check_message, check_room, measure
from chatapp.chat.engine_time import EngineClock
from chatapp.chat.history import HistoryStore
from chatapp.chat.message import ChatMessage
from chatapp.chat.reply_settings import generation_settings, policy_setting
from chatapp.chat.reply_values import DraftLengthUse, Ending, k_label
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import (
    ChatEntry,
    ChatEvent,
    PlanEvent,
    ReplayJob,
    Turn,
    turn_meta,
)
from chatapp.engine.contracts import DraftHints
from chatapp.engine.loop import ContextOverflowError
from chatapp.engine.stats import ReplayStats, TurnStats, decode_tokens_per_s, is_target_only
from chatapp.errors import UserFacingError
from chatapp.policy.draft_length import DraftLength
from chatapp.settings.config import Config

# A target-only turn shorter than this is too noisy to be the speedup baseline.
MIN_BASELINE_TOKENS = 8


class ChatActionError(UserFacingError):
    """A chat action that cannot be done now (nothing to regenerate, a reply is streaming...)."""


class Conversation:
    """One chat and the models that answer in it (see the module docstring for the contract)."""

    def __init__(self, config: Config, history: HistoryStore | None = None, *,
                 on_write_error: Callable[[str], None] | None = None) -> None:
        """``history``: where the chats are saved (None: nowhere, unless ``chats.open`` opens
        one); ``on_write_error``: told when a write to it failed (the chat goes on)."""
        self.config = config
        self.chats = SavedChats(history, on_write_error=on_write_error,
                                on_delete=self._index_forgets)
        self.session: ChatSession | None = None
        self.policy = DraftLength(policy_setting(config))  # every turn drafts with it, for good
        self.chat_id: int | None = None
        self.entries: list[ChatEntry] = []
        self.turn: Turn | None = None  # the reply being made, in this chat or an earlier one
        self.replaying: ReplayJob | None = None
        self.epoch = 0
        self.baseline_tps: float | None = None  # decode tok/s of a target-only turn, this pair
        self._forgotten: set[int] = set()  # chats deleted since the last reply (``DraftHints``)

    # -- models ---------------------------------------------------------------------------------

    def attach(self, session: ChatSession) -> None:
        """Chat with ``session``'s models from now on."""
        self.session = session
        self.policy.models_loaded(policy_setting(self.config))
        self.baseline_tps = None  # a new pair: measure the target alone again

    def release(self) -> None:
        """Close the models (a reload follows, or the chat ends)."""
        if self.session is not None:
            self.session.close()
            self.session = None

    @property
    def has_drafter(self) -> bool:
        return self.session is not None and self.session.has_drafter

    @property
    def n_ctx(self) -> int | None:
        """The loaded target's context window, in tokens (None: no models loaded)."""
        return self.session.n_ctx if self.session is not None else None

    @property
    def busy(self) -> bool:
        """A reply or a replay is running: the models take no other work."""
        return self.turn is not None or self.replaying is not None

    def reconfigure(self, config: Config) -> bool:
        """Use ``config`` from the next reply on, recorded with the open chat; True: reload."""
        old, self.config = self.config, config
        self.chats.record_settings(self.chat_id, old, config)
        if config.draft_length != old.draft_length:
            self.policy.configure(policy_setting(config), loaded=self.session is not None)
        if self.session is not None:
            self.session.configure(generation_settings(config), config.system_prompt)
            if config.seed is not None and config.seed != old.seed:
                self.session.reseed(config.seed)
        return config.needs_reload(old)

    # -- the draft length ------------------------------------------------------------------------

    @property
    def k_label(self) -> str:
        """The draft length in force, as the front ends show it ("3", "auto(4)")."""
        return k_label(self.policy.current_k(), self.policy.adaptive)

    def adjust_draft_length(self, delta: int) -> int:
        """K + ``delta`` (an adaptive policy becomes a fixed K); returns the K now in force."""
        return self.policy.adjust(delta, self.turn.last_k if self.turn else None)

    def set_draft_length(self, k: int) -> None:
        self.policy.set(k)

    def set_auto_draft_length(self) -> None:
        auto = dataclasses.replace(self.config, draft_length="auto")
        self.policy.configure(policy_setting(auto), loaded=self.session is not None)

    # -- chats ----------------------------------------------------------------------------------

    def open_chat(self, chat_id: int | None) -> list[ChatEntry]:
        """Show chat ``chat_id`` (None: a new, empty chat); returns its messages. A reply still
        being made is stopped and saved to its own chat."""
        if self.turn is not None:
            self.turn.cancel.set()
        self.epoch += 1
        self.chat_id = chat_id
        stored = self.history.messages(chat_id) if self.history and chat_id is not None else []
        self.entries = [ChatEntry.from_stored(m) for m in stored]
        return self.entries

    @property
    def history(self) -> HistoryStore | None:
        """The store behind ``chats`` (for this layer and tests; front ends use ``chats``)."""
        return self.chats.store

    def _index_forgets(self, chat_id: int) -> None:
        """``chat_id`` left the history: the next reply's hints say so to the suffix index."""
        self._forgotten.add(chat_id)

    def _hints(self, turn: Turn) -> DraftHints:
        """What ``turn`` tells the drafters: the chat its text is filed under (None: not saved)
        and the chats deleted since the last reply."""
        forgotten, self._forgotten = frozenset(self._forgotten), set()
        return DraftHints(document=turn.chat_id, forgotten=forgotten)

    @property
    def messages(self) -> list[ChatMessage]:
        """The open chat as the models see it."""
        return [ChatMessage(entry.role, entry.sent_text) for entry in self.entries]

    def is_current(self, turn: Turn) -> bool:
        """Whether ``turn`` belongs to the chat open now."""
        return turn.epoch == self.epoch

    # -- turns ----------------------------------------------------------------------------------

    def begin(self, text: str, attachments: Sequence[Attachment] = ()) -> Turn:
        """A new user message (with the files ``attachments``, read by ``read_attachment``) and
        the turn that answers it; refused, nothing saved, when its files would not fit, or the
        turn would not under ``overflow = "refuse"`` (``chatapp.chat.context.check_message``)."""
        session = self._check_idle()
        check_message(session, self.messages, text, attachments, self.config.overflow)
        entry = ChatEntry("user", text, self._save_user_message(text, attachments),
                          attachments=tuple(attachments))
        self.entries.append(entry)
        return self._start(text, user_entry=entry)

    def regenerate(self, new_seed: bool = False) -> Turn:
        """The last reply made again with the same settings (``new_seed``: the random generator
        restarted from a fresh seed, in ``turn.meta["seed"]``). The old reply is replaced once
        the new one is done; if the new one fails before its first token, it stays."""
        session = self._check_idle()
        if len(self.entries) < 2 or self.entries[-1].role != "assistant":
            raise ChatActionError("There is no reply to regenerate yet: send a message first.")
        check_room(session, self.messages[:-1], self.config.overflow)
        old = self.entries.pop()
        meta: dict[str, Any] = {}
        if new_seed:
            meta["seed"] = random.SystemRandom().randrange(2**32)
            self._require_session().reseed(meta["seed"])
        return self._start(self.entries[-1].content, replaces=old, meta=meta)

    def edit(self, entry: ChatEntry, text: str) -> tuple[Turn, str]:
        """Send ``text`` in place of the user message ``entry``: the later turns are replaced.
        The chat as it was is kept in the history as its own chat; returns the turn and that
        chat's title ("" when nothing was saved: no history, or nothing came after). The
        message keeps its attachments."""
        session = self._check_idle()
        if entry not in self.entries or entry.role != "user":
            raise ChatActionError("Only your own messages of this chat can be edited.")
        check_message(session, self.messages[:self.entries.index(entry)], text,
                      entry.attachments, self.config.overflow)
        backup = self.chats.keep_before_edit(self.chat_id, entry.message_id)
        del self.entries[self.entries.index(entry):]
        return self.begin(text, entry.attachments), backup

    def context_use(self, text: str = "",
                    attachments: Sequence[Attachment] = ()) -> ContextUse | None:
        """The next turn's context with the message ``text`` (``measure``); None: no models."""
        if self.session is None:
            return None
        message = ChatMessage("user", message_text(text, attachments))
        return measure(self.session, [*self.messages, message], self.config.overflow)

    def _check_idle(self) -> ChatSession:
        session = self._require_session()
        if self.turn is not None:
            raise ChatActionError("A reply is still streaming: Esc stops it.")
        if self.replaying is not None:
            raise ChatActionError("A replay at K = 0 is running: Esc stops it.")
        return session

    def _require_session(self) -> ChatSession:
        if self.session is None:
            raise ChatActionError("The models are not loaded yet.")
        return self.session

    def _start(self, user_text: str, *, user_entry: ChatEntry | None = None,
               replaces: ChatEntry | None = None, meta: dict[str, Any] | None = None) -> Turn:
        k = DraftLengthUse(self.policy.adaptive, self.policy.current_k())
        turn = Turn(messages=self.messages, user_text=user_text, chat_id=self.chat_id,
                    epoch=self.epoch, user_entry=user_entry, replaces=replaces,
                    meta=turn_meta(self._require_session().settings, self.config, k)
                    | (meta or {}), k_start=k.start, adaptive=k.adaptive)
        self.turn = turn
        return turn

    def stream(self, turn: Turn) -> Iterator[ChatEvent]:
        """(Worker thread.) ``turn``'s events: a ``PlanEvent``, then the engine's. Raises what
        the models raise; a message that does not fit the context sets ``turn.not_sent``."""
        session = self._require_session()
        try:
            plan, events = session.reply(turn.messages, self.policy, hints=self._hints(turn),
                                         cancel=turn.cancel)
        except ContextOverflowError:
            turn.not_sent = True
            raise
        yield PlanEvent(len(plan.tokens), plan.dropped_messages, plan.note)
        yield from turn.clock.follow(events)

    def run(self, turn: Turn, on_event: Callable[[ChatEvent], None] | None = None) -> ChatEntry:
        """Stream ``turn`` on this thread: every event is applied to the turn, then handed to
        ``on_event``; the turn is finished and its entry (saved, added to its chat) returned. When
        the models or ``on_event`` raise, the stream is closed (the engine leaves its caches
        verified), the turn fails (``fail``) and the error is raised again."""
        events = self.stream(turn)
        try:
            for event in events:
                turn.apply(event)
                if on_event is not None:
                    on_event(event)
        except BaseException:
            events.close()
            self.fail(turn)
            raise
        return self.finish(turn)

    def finish(self, turn: Turn) -> ChatEntry:
        """The reply is done or stopped (its ``DoneEvent`` applied, or ``fail`` ended it): save
        it once and add it to its chat."""
        if turn.finish_reason is None:
            raise ValueError("finish needs a turn that ended: apply its DoneEvent first")
        finish_reason, stats = turn.finish_reason, turn.stats()
        entry = self._save_reply(turn, finish_reason, stats)
        if self.is_current(turn):
            self.entries.append(entry)
        if self.turn is turn:
            self.turn = None
        if finish_reason is not Ending.ERROR:
            self.policy.remember(policy_setting(self.config))
        if is_target_only(stats) and stats.tokens >= MIN_BASELINE_TOKENS:
            self.baseline_tps = decode_tokens_per_s(stats)
        return entry

    def fail(self, turn: Turn) -> ChatEntry | None:
        """The reply failed. What it made so far is kept (the entry returned); a reply without
        a token is rolled back (None): its user message leaves the chat and the history, and
        the front end gives ``turn.user_text`` back to the user."""
        turn.finish_reason = Ending.ERROR
        if turn.text:
            return self.finish(turn)
        if self.turn is turn:
            self.turn = None
        current = self.is_current(turn)
        if turn.replaces is not None:
            if current:
                self.entries.append(turn.replaces)
            return None
        entry = turn.user_entry
        if current and entry in self.entries:
            self.entries.remove(entry)
        if entry is not None and self.chats.remove_message(entry.message_id, turn.chat_id):
            self._index_forgets(turn.chat_id)
            if self.chat_id == turn.chat_id:
                self.chat_id = None
        return None

    def stop_and_save(self) -> None:
        """Stop the reply being made, if any, and save it as it stands (the app is ending)."""
        turn = self.turn
        if turn is not None and not turn.done:
            turn.cancel.set()
            self._save_reply(turn, Ending.CANCELLED, turn.stats())
        if self.replaying is not None:
            self.replaying.cancel.set()

    def _save_user_message(self, text: str, attachments: Sequence[Attachment]) -> int | None:
        if self.history is None:
            return None
        if self.chat_id is None:
            self.chat_id = self.chats.start_chat(text or " ".join(a.path for a in attachments),
                                                 self.config)
            if self.chat_id is None:
                return None
        return self.chats.write(self.history.add_message, self.chat_id, "user", text,
                                attachments=attachments)

    def _save_reply(self, turn: Turn, finish_reason: Ending, stats: TurnStats) -> ChatEntry:
        turn.meta["k"] = turn.k_use().to_json()
        turn.meta["engine_decode_tps"] = turn.clock.decode_tokens_per_s(stats)
        entry = ChatEntry("assistant", turn.text, None, list(turn.pieces), stats, finish_reason,
                          turn.meta)
        if turn.saved or self.history is None or turn.chat_id is None:
            return entry
        turn.saved = True
        replaced = turn.replaces.message_id if turn.replaces is not None else None
        entry.message_id = self.chats.write(
            self.history.add_message, turn.chat_id, "assistant", turn.text, runs=turn.pieces,
            finish_reason=finish_reason, stats=stats, meta=turn.meta, replacing=replaced)
        return entry

    # -- replay at K = 0 ------------------------------------------------------------------------

    def prepare_replay(self, entry: ChatEntry) -> ReplayJob:
        """A replay of the reply ``entry`` at K = 0 (plain decoding, the same prompt, as many
        tokens), to measure what speculation bought on it; ``run_replay`` runs it."""
        self._check_idle()
        if entry not in self.entries or entry.role != "assistant" or entry.stats is None \
                or not entry.stats.tokens:
            raise ChatActionError("Pick a reply with statistics to replay (a saved reply).")
        if is_target_only(entry.stats):
            raise ChatActionError("This reply was decoded at K = 0 already: it is the baseline.")
        index = self.entries.index(entry)
        speculative_tps = entry.engine_decode_tps
        if speculative_tps is None:  # saved before replies were measured in the engine
            speculative_tps = decode_tokens_per_s(entry.stats)
        job = ReplayJob(entry, self.messages[:index], entry.stats.tokens, speculative_tps)
        self.replaying = job
        return job

    def run_replay(self, job: ReplayJob) -> ReplayStats | None:
        """(Worker thread.) Decode ``job``'s prompt with the target alone; None if stopped. The
        session's random generator is left alone, so later replies are as they would have been.
        Its decode rate is the engine's, as the reply's is (``EngineClock``: neither counts the
        time their consumer held the stream)."""
        clock = EngineClock()
        stats = self._require_session().decode_alone(job.messages, job.tokens, job.cancel, clock)
        if stats is None:
            return None
        return ReplayStats(clock.decode_tokens_per_s(stats), job.speculative_tps, stats.tokens)

    def end_replay(self, job: ReplayJob, result: ReplayStats | None) -> None:
        """The replay is over: keep its measurement with the reply's statistics."""
        if self.replaying is job:
            self.replaying = None
        if result is None:
            return
        job.entry.meta["replay"] = result.to_json()
        if self.history is not None and job.entry.message_id is not None:
            self.chats.write(self.history.set_turn_meta, job.entry.message_id, job.entry.meta)

    def close(self) -> None:
        """Stop and save a reply being made, and close the models, unless a reply or a replay
        still runs on them in a worker (the process is ending then: it frees them)."""
        busy = self.busy
        self.stop_and_save()
        if not busy:
            self.release()
