"""The one reply pipeline: every reply, whoever asks (the chat app, ``specchat run``, the web tab,
the API server), is ``ChatSession.reply``, and nothing else in the chat layer calls the engine.

``reply(messages, policy, rules=..., overrides=..., hints=..., cancel=...)`` plans the prompt with
the caller's ``PromptRules`` (``chatapp.chat.prompt``: a chat trims its oldest turns, the API
refuses), the room for the reply by one rule (``reply_room``), and returns the plan with the
engine's event stream; the per-reply ``DraftHints`` (a predicted output, which document of the
history the suffix index files the reply under) go to the engine, which hands them to the
drafter. ``decode_alone`` decodes a reply again with the target alone (a replay at K = 0).

The session hides its engine: callers get what they need of it (``n_ctx``, ``tokenize``, the
prompt of some messages, the target's name, whether there is a drafter). It owns the random
generator, seeded once, so the same seed and settings give the same conversation; a request may
bring a seed of its own (``ReplyOverrides``), which leaves the session's generator alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from chatapp.chat.engine_time import EngineClock
from chatapp.chat.message import ChatMessage
from chatapp.chat.prompt import (
    TRIM_OLDEST,
    PromptPlan,
    PromptRules,
    fallback_template_note,
    reply_room,
)
from chatapp.chat.reply_grammar import ReplyGrammar
from chatapp.chat.tools import NO_TOOLS, Tools
from chatapp.engine.contracts import NO_HINTS, DraftHints, DraftPolicy
from chatapp.engine.events import DoneEvent, Event
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from chatapp.engine.stats import TurnStats
from chatapp.grammar.matcher import GrammarConstraint, Grammars
from chatapp.policy.fixed import FixedDraftLength
from chatapp.text_budget import PromptCancelled, plain_tokens


@dataclass(frozen=True)
class ReplyOverrides:
    """What one request sets for its reply alone; None takes the session's settings."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    grammar: ReplyGrammar | None = None
    tools: Tools = NO_TOOLS  # shown to the model by the chat template
    min_p: float | None = None


UNTIL_CONTEXT_END = -1  # ReplyOverrides.max_tokens: the reply may run to the window's end
NO_OVERRIDES = ReplyOverrides()


class ChatSession:
    """The reply pipeline over one loaded pair of models; see the module docstring."""

    def __init__(self, engine: SpeculativeEngine, settings: GenerationSettings,
                 seed: int, system_prompt: str = "", notes: tuple[str, ...] = (),
                 takes_prediction: bool = False) -> None:
        """``notes``: what the user should be told once about how the models run here;
        ``takes_prediction``: the drafter drafts from a predicted output (the default drafter
        does; the draft model alone does not)."""
        self._engine = engine
        self._settings = settings
        self._seed = seed
        self._system_prompt = system_prompt
        self._rng = np.random.default_rng(seed)
        self._told_fallback = False
        self._grammars = Grammars(engine.target)
        self.notes = notes
        self.takes_prediction = takes_prediction

    # -- what callers may know of the models ---------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """The target's context window, in tokens."""
        return self._engine.target.n_ctx

    @property
    def target_name(self) -> str:
        return self._engine.target_name

    @property
    def has_drafter(self) -> bool:
        return self._engine.drafter is not None

    def tokenize(self, text: str, limit: int | None = None,
                 cancel: threading.Event | None = None) -> list[int]:
        """``text``'s tokens in the target's vocabulary, as plain text (no control token);
        ``PromptOverLimit`` as soon as they are known to pass ``limit``, ``PromptCancelled``
        once ``cancel`` is set (``chatapp.text_budget``)."""
        return plain_tokens(text, self._engine.target.tokenize, limit, cancel)

    # -- settings -------------------------------------------------------------------------------

    @property
    def settings(self) -> GenerationSettings:
        return self._settings

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    def configure(self, settings: GenerationSettings, system_prompt: str) -> None:
        """Use ``settings`` and ``system_prompt`` from the next reply on."""
        self._settings = settings
        self._system_prompt = system_prompt

    def reseed(self, seed: int) -> None:
        """Restart the random generator from ``seed`` (the same seed gives the same replies)."""
        self._seed = seed
        self._rng = np.random.default_rng(seed)

    def close(self) -> None:
        """Release both models; best effort (the process may be exiting)."""
        try:
            self._engine.close()
        except Exception:
            pass

    # -- prompts (the chat's rules; the context meter measures with them) -----------------------

    @property
    def reply_room(self) -> int:
        """Tokens of the context window kept free for a reply of the session's settings."""
        return reply_room(self._settings.max_tokens, self.n_ctx)

    @property
    def prompt_room(self) -> int:
        """The most tokens a chat's prompt may have: the context window less the reply's room."""
        return self.n_ctx - self.reply_room

    def prompt(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The chat prompt of ``messages`` (their system messages left out) after the system
        prompt, through the target's chat template."""
        return self._renderer(None)(TRIM_OLDEST.with_system(self._system_prompt, messages))

    def message_tokens(self, text: str) -> int:
        """The length of the prompt that holds the system prompt and the user message ``text``
        alone (what must fit however many older turns are left out)."""
        return len(self.prompt([ChatMessage("user", text)]))

    def fit(self, messages: Sequence[ChatMessage]) -> PromptPlan | None:
        """The chat prompt of ``messages`` with the fewest oldest turns left out so that it and
        ``reply_room`` fit (``TrimOldest.fit``); None when even the newest message alone does
        not."""
        return TRIM_OLDEST.fit(self._renderer(None), self._system_prompt, messages,
                               self.prompt_room)

    # -- the reply pipeline ---------------------------------------------------------------------

    def reply(self, messages: Sequence[ChatMessage], policy: DraftPolicy, *,
              rules: PromptRules = TRIM_OLDEST, overrides: ReplyOverrides = NO_OVERRIDES,
              hints: DraftHints = NO_HINTS, cancel: threading.Event | None = None,
              ) -> tuple[PromptPlan, Iterator[Event]]:
        """Plan the prompt of ``messages`` under ``rules`` (may raise what they raise) and return
        the plan with the reply's event stream, drafted with ``policy`` and ``hints``; setting
        ``cancel`` ends the reply after the step under way. A grammar in ``overrides`` holds the
        reply to it (``GrammarError`` when llguidance cannot compile it)."""
        settings = self._settings_with(overrides)
        plan = rules.plan(self._renderer(cancel, overrides.tools), self._system_prompt, messages,
                          self.n_ctx,
                          reply_room(settings.max_tokens, self.n_ctx))
        plan = replace(plan, fallback_template=self._engine.target.uses_fallback_template,
                       note=self._fallback_note())
        constraint = self._constraint(overrides.grammar)
        rng = self._rng if overrides.seed is None else np.random.default_rng(overrides.seed)
        return plan, self._engine.generate(plan.tokens, settings, rng, policy, cancel, hints,
                                           constraint)

    def decode_alone(self, messages: Sequence[ChatMessage], max_tokens: int,
                     cancel: threading.Event, clock: EngineClock | None = None
                     ) -> TurnStats | None:
        """Decode the reply to ``messages`` (the chat's prompt) with the target alone (K = 0),
        ``max_tokens`` tokens at most, sampling from a generator seeded as this session's was:
        its final statistics, None when ``cancel`` stopped it. The session's own generator is
        left alone, so later replies are as they would have been. ``clock`` times the stream's
        holding."""
        try:
            plan = TRIM_OLDEST.plan(self._renderer(cancel), self._system_prompt, messages,
                                    self.n_ctx, self.reply_room)
        except PromptCancelled:  # stopped while its prompt was read
            return None
        settings = replace(self._settings, max_tokens=max_tokens)
        rng = np.random.default_rng(self._seed)
        events = self._engine.generate(plan.tokens, settings, rng, FixedDraftLength(0), cancel)
        for event in (clock or EngineClock()).follow(events):
            if isinstance(event, DoneEvent):
                return None if cancel.is_set() else event.stats
        return None

    def _renderer(self, cancel: threading.Event | None, tools: Tools = NO_TOOLS
                  ) -> "_TargetRender":
        """The target's prompt rendering (its chat template showing ``tools``), its
        tokenization stopped once ``cancel`` is set."""
        return _TargetRender(self._engine, cancel, tools)

    def _constraint(self, grammar: ReplyGrammar | None) -> GrammarConstraint | None:
        """A reply's constraint for ``grammar`` over the target's vocabulary (None: none)."""
        return None if grammar is None else self._grammars.constraint(grammar.lark,
                                                                       grammar.purpose)

    def _settings_with(self, overrides: ReplyOverrides) -> GenerationSettings:
        base = self._settings
        sampling = SamplingParams(
            base.sampling.temperature if overrides.temperature is None else overrides.temperature,
            base.sampling.top_k if overrides.top_k is None else overrides.top_k,
            base.sampling.top_p if overrides.top_p is None else overrides.top_p,
            base.sampling.min_p if overrides.min_p is None else overrides.min_p)
        max_tokens = (self.n_ctx if overrides.max_tokens == UNTIL_CONTEXT_END
                      else overrides.max_tokens or base.max_tokens)
        return GenerationSettings(sampling, max_tokens)

    def _fallback_note(self) -> str:
        """The fallback template's note on the first reply that used it, else ""."""
        if not self._engine.target.uses_fallback_template or self._told_fallback:
            return ""
        self._told_fallback = True
        return fallback_template_note(self.target_name)


class _TargetRender:
    """The engine's target as a ``chatapp.chat.prompt.PromptRender`` for one reply: its chat
    template shows ``tools``; every tokenization stops once ``cancel`` is set
    (``PromptCancelled``)."""

    def __init__(self, engine: SpeculativeEngine, cancel: threading.Event | None,
                 tools: Tools = NO_TOOLS) -> None:
        self._target = engine.target
        self._cancel = cancel
        self._tools = tools

    def __call__(self, messages: Sequence[ChatMessage], limit: int | None = None) -> list[int]:
        return self._target.chat_prompt(messages, limit, self._cancel, self._tools.shown)

    def text(self, text: str, limit: int | None = None) -> list[int]:
        return plain_tokens(text, self._target.tokenize, limit, self._cancel)

    @property
    def fim(self) -> tuple[int, int, int] | None:
        return self._target.fim_ids

    @property
    def fim_spellings(self) -> tuple[str, str, str] | None:
        fim = self._target.fim_ids
        if fim is None:
            return None
        prefix, suffix, middle = (self._target.token_bytes(t).decode("utf-8", "replace")
                                  for t in fim)
        return prefix, suffix, middle

    @property
    def name(self) -> str:
        return self._target.name
