"""A conversation bound to an engine: builds a prompt that fits the context, streams the reply,
and decodes a reply again with the target alone (``decode_alone``: a replay at K = 0).

``ChatSession.stream(messages, ...)`` turns the conversation (system prompt first, if any) into
prompt tokens with the target's chat template. When the conversation and ``reply_room`` have
outgrown the context window, the oldest turns are dropped (``fit``: never the system prompt, never
the newest user message) and ``PromptPlan.dropped_messages`` says how many, so the UI can tell the
user (the ``overflow`` setting's "refuse" is the conversation's: ``chatapp.chat.context``); when
the target has no usable chat template, ``PromptPlan.fallback_template`` is set and
``fallback_template_note`` is what to tell the user. The session owns the random generator,
seeded once, so the same seed and settings give the same conversation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from chatapp.backends.chat_template import ChatMessage
from chatapp.chat.engine_time import EngineClock
from chatapp.drafters.suffix import SuffixSource
from chatapp.engine.contracts import DraftPolicy
from chatapp.engine.events import DoneEvent, Event
from chatapp.engine.loop import ContextOverflowError, GenerationSettings, SpeculativeEngine
from chatapp.engine.stats import TurnStats
from chatapp.policy.fixed import FixedDraftLength

# Room kept free for the reply when trimming: at least this many tokens, at most max_tokens.
MIN_REPLY_ROOM = 64


@dataclass(frozen=True)
class PromptPlan:
    tokens: list[int]
    dropped_messages: int
    fallback_template: bool = False  # the target had no usable chat template; ChatML was used


def fallback_template_note(model_name: str) -> str:
    """What to tell the user when ``model_name``'s chat template was missing or failed."""
    return (f"{model_name} has no usable chat template, so the conversation is formatted with a "
            "plain ChatML template; replies may be off. A model file that includes its chat "
            "template (every model in `specchat models` does) avoids this.")


class ChatSession:
    def __init__(self, engine: SpeculativeEngine, settings: GenerationSettings,
                 seed: int, system_prompt: str = "", notes: tuple[str, ...] = (),
                 history_index: SuffixSource | None = None) -> None:
        """``notes``: what the user should be told once about how the models run here.
        ``history_index``: the default drafter's suffix index over the history; the conversation
        tells it which chat is open and which was deleted (``SuffixSource.open_chat``,
        ``remove_chat``)."""
        self.engine = engine
        self.notes = notes
        self.history_index = history_index
        self.settings = settings
        self.seed = seed
        self.system_prompt = system_prompt
        self.rng = np.random.default_rng(seed)

    def configure(self, settings: GenerationSettings, system_prompt: str) -> None:
        """Use ``settings`` and ``system_prompt`` from the next reply on."""
        self.settings = settings
        self.system_prompt = system_prompt

    def reseed(self, seed: int) -> None:
        """Restart the random generator from ``seed`` (the same seed gives the same replies)."""
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def close(self) -> None:
        """Release both models; best effort (the process may be exiting)."""
        try:
            self.engine.close()
        except Exception:
            pass

    @property
    def reply_room(self) -> int:
        """Tokens of the context window kept free for the reply when the prompt is planned."""
        return min(self.settings.max_tokens, max(MIN_REPLY_ROOM, self.engine.target.n_ctx // 4))

    @property
    def prompt_room(self) -> int:
        """The most tokens a prompt may have: the context window less the reply's room."""
        return self.engine.target.n_ctx - self.reply_room

    def message_tokens(self, text: str) -> int:
        """The length of the prompt that holds the system prompt and the user message ``text``
        alone (what must fit however many older turns are left out)."""
        return len(self.prompt([ChatMessage("user", text)]))

    def prompt(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt tokens of ``messages`` (their system messages left out), after the system
        prompt, through the target's chat template."""
        system = [ChatMessage("system", self.system_prompt)] if self.system_prompt else []
        return self.engine.target.chat_prompt(system + [m for m in messages if m.role != "system"])

    def fit(self, messages: Sequence[ChatMessage]) -> PromptPlan | None:
        """The prompt of ``messages`` (system messages left out) with the fewest oldest messages
        left out so that it and ``reply_room`` fit the context window; None when even the newest
        message alone does not fit. The prompt starts at a user message (whole turns leave), at
        the first message, or at the newest alone.

        Assumes that leaving more out never makes the prompt longer (true of chat templates),
        so the start is found by bisection: a few tokenizations, however long the chat."""
        history = [m for m in messages if m.role != "system"]
        if not history:
            return None
        starts = [i for i, m in enumerate(history) if i == 0 or m.role == "user"]
        starts += [] if starts[-1] == len(history) - 1 else [len(history) - 1]
        found: dict[int, list[int]] = {}

        def fits(start: int) -> bool:
            found[start] = self.prompt(history[start:])
            return len(found[start]) <= self.prompt_room

        low, high = 0, len(starts) - 1
        if not fits(starts[high]):
            return None
        while low < high:  # the first start that fits is in starts[low:high + 1]
            middle = (low + high) // 2
            if fits(starts[middle]):
                high = middle
            else:
                low = middle + 1
        start = starts[low]  # tested, and it fitted
        return PromptPlan(found[start], start, self.engine.target.uses_fallback_template)

    def plan_prompt(self, messages: Sequence[ChatMessage]) -> PromptPlan:
        """Prompt tokens for ``messages``, dropping the oldest turns until a reply fits
        (``fit``).

        Raises ``ContextOverflowError`` when even the newest message alone does not fit.
        """
        plan = self.fit(messages)
        if plan is not None:
            return plan
        target = self.engine.target
        tokens = self.prompt([m for m in messages if m.role != "system"][-1:])
        raise ContextOverflowError(
            f"Your message is {len(tokens)} tokens with the chat template, and the context window "
            f"holds {target.n_ctx} with {self.reply_room} kept for the reply. Shorten the "
            "message, or start specchat with a larger --n-ctx."
        )

    def stream(self, messages: Sequence[ChatMessage], policy: DraftPolicy,
               cancel: threading.Event | None = None) -> tuple[PromptPlan, Iterator[Event]]:
        """Plan the prompt (may raise) and return it with the reply's event stream."""
        plan = self.plan_prompt(messages)
        return plan, self.engine.generate(plan.tokens, self.settings, self.rng, policy, cancel)

    def decode_alone(self, messages: Sequence[ChatMessage], max_tokens: int,
                     cancel: threading.Event, clock: EngineClock | None = None
                     ) -> TurnStats | None:
        """Decode the reply to ``messages`` with the target alone (K = 0), ``max_tokens`` tokens
        at most, sampling from a generator seeded as this session's was: its final statistics,
        None when ``cancel`` stopped it. The session's own generator is left alone, so later
        replies are as they would have been. ``clock`` times the stream's holding."""
        plan = self.plan_prompt(messages)
        settings = replace(self.settings, max_tokens=max_tokens)
        rng = np.random.default_rng(self.seed)
        events = self.engine.generate(plan.tokens, settings, rng, FixedDraftLength(0), cancel)
        for event in (clock or EngineClock()).follow(events):
            if isinstance(event, DoneEvent):
                return None if cancel.is_set() else event.stats
        return None
