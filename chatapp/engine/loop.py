"""The speculative decoding engine: prompt token ids in, an event stream out.

``SpeculativeEngine.generate`` reads the prompt (what is not cached) in chunks of ``PROMPT_CHUNK``
tokens, yielding a ``PromptProgressEvent`` after each when there is more than one, and may be
cancelled between two (the cache keeps what was read); it yields a ``PromptEvent`` once the
prompt is evaluated, one
``TokenEvent`` per emitted token, a ``StepEvent`` after every target forward, and a final
``DoneEvent``. Each step: ask the draft policy for a budget, let the drafter propose within it,
evaluate the proposal with the target in one forward (logits for the K+1 positions only), accept or
replace it with ``chatapp.engine.verify``, and tell the policy what happened (``StepOutcome``: the
source that proposed, the counts, the times, and any would-be outcomes the drafter scored). A step
with nothing drafted is plain target decoding through the same stream (source ``target``).

Between turns the backends' KV caches are kept; the next turn evaluates only what differs from
what is cached. The engine knows token ids and probabilities, never a library or a widget.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from chatapp.backends.base import Backend
from chatapp.engine.constraint import (
    TokenConstraint,
    constrain_draft,
    constrained_probabilities,
    masked_logits,
)
from chatapp.engine.contracts import (
    NO_HINTS,
    DraftBudget,
    Drafter,
    DraftHints,
    DraftPolicy,
    Proposal,
    ShadowScore,
    StepOutcome,
)
from chatapp.engine.events import (
    DoneEvent,
    Event,
    FinishReason,
    PromptEvent,
    PromptProgressEvent,
    StepEvent,
    TokenEvent,
    TokenSource,
)
from chatapp.engine.kv import evaluate_in_chunks, evaluate_sequence, rollback_to_prefix
from chatapp.engine.sampling import SamplingParams, greedy_tokens, probabilities
from chatapp.engine.stats import StatsRecorder
from chatapp.engine.verify import verify, verify_greedy
from chatapp.errors import UserFacingError

PROMPT_CHUNK = 512  # prompt tokens evaluated per call: a long prompt's progress and cancel points


class IncompatibleModelsError(UserFacingError):
    """Draft and target do not share a vocabulary."""


class ContextOverflowError(UserFacingError):
    """The prompt does not fit in the context window."""


@dataclass(frozen=True)
class GenerationSettings:
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 512


class TextStream:
    """Turns token bytes into text without ever splitting a UTF-8 character.

    Invalid byte sequences become U+FFFD instead of raising.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)


def check_compatible(draft: Backend, target: Backend) -> None:
    """Raise ``IncompatibleModelsError`` unless both models have the same token list."""
    if draft.vocab_size != target.vocab_size or (
            draft.vocab_fingerprint() != target.vocab_fingerprint()):
        raise IncompatibleModelsError(
            f"The draft model '{draft.name}' (vocabulary {draft.vocab_size}) and the target model "
            f"'{target.name}' (vocabulary {target.vocab_size}) do not share a vocabulary, so the "
            "draft's tokens cannot be verified. Pick a draft from the same model family "
            "(see `specchat models`), or run without a draft (-k 0)."
        )


class _PlainDecoding:
    """The policy of a turn given none: never draft."""

    adaptive = False

    def current_k(self) -> int:
        return 0

    def budget(self) -> DraftBudget:
        return DraftBudget.uniform(0)

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def start_turn(self) -> None:
        pass


class SpeculativeEngine:
    """Drives a target backend and an optional drafter. Not thread-safe: one turn at a time."""

    def __init__(self, target: Backend, drafter: Drafter | None = None) -> None:
        self.target = target
        self.drafter = drafter

    @property
    def target_name(self) -> str:
        return self.target.name

    @property
    def drafter_name(self) -> str | None:
        """The drafter's name, or None when the engine decodes with the target alone."""
        return self.drafter.name if self.drafter is not None else None

    def close(self) -> None:
        """Free every model: the drafter's, then the target. The engine is unusable after."""
        try:
            if self.drafter is not None:
                self.drafter.close()
        finally:
            self.target.close()

    def generate(
        self,
        prompt: Sequence[int],
        settings: GenerationSettings,
        rng: np.random.Generator,
        policy: DraftPolicy | None = None,
        cancel: threading.Event | None = None,
        hints: DraftHints = NO_HINTS,
        constraint: TokenConstraint | None = None,
    ) -> Iterator[Event]:
        """Stream the reply to ``prompt`` (token ids, chat template already applied). ``hints``
        go to the drafter's ``prefill`` and hold for this reply only. ``constraint``: the grammar
        the reply must match, at its start state (``chatapp.engine.constraint``: the reply
        follows the target's law restricted to it, exactly, and ends where it is complete)."""
        policy = policy or _PlainDecoding()
        cancel = cancel or threading.Event()
        if len(prompt) + 1 > self.target.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(prompt)} tokens but the context window holds "
                f"{self.target.n_ctx}. Shorten the message or raise n_ctx (--n-ctx)."
            )
        turn = _Turn(self, list(prompt), settings, rng, policy, cancel, hints, constraint)
        yield from turn.run()


_StepEnd = tuple[StepEvent, FinishReason | None]  # a step's event, and why the reply ends there


class _Turn:
    """The state of one reply; ``run`` is the step loop.

    The engine is the one place that measures a turn: every timing reads ``_clock``, and a
    step's statistics are taken at the step's latest reading (the end of its verification, or
    its first token), so that reporting them costs no reading of its own."""

    def __init__(self, engine: SpeculativeEngine, tokens: list[int], settings: GenerationSettings,
                 rng: np.random.Generator, policy: DraftPolicy, cancel: threading.Event,
                 hints: DraftHints = NO_HINTS, constraint: TokenConstraint | None = None) -> None:
        self.target = engine.target
        self.drafter = engine.drafter
        self.tokens = tokens
        self.settings = settings
        self.rng = rng
        self.policy = policy
        self.cancel = cancel
        self.hints = hints
        self.constraint = constraint
        self.stats = StatsRecorder(prompt_tokens=len(tokens))
        self.text = TextStream()
        self.emitted = 0
        self.last_k = 0  # the K of the latest step that asked the policy
        self.start = time.perf_counter()
        self.now = self.start  # the latest reading of the clock
        self.prompt_started = self.start  # when the prompt's reading began

    def run(self) -> Iterator[Event]:
        """The turn's events. Whatever stops a step (an exception, the consumer closing the
        stream), both caches are left holding verified positions only."""
        yield from self._read_prompt()
        if self.cancel.is_set():  # stopped while reading the prompt
            self.stats.prompt_s = self._clock() - self.prompt_started
            yield DoneEvent(FinishReason.CANCELLED,
                            self.stats.snapshot(self.now - self.start, self.target.threads))
            return
        yield self._prefill()
        step = 0
        reason = self._finish_reason_before_step()
        while reason is None:
            verified = len(self.tokens)
            try:
                event, reason = yield from self._step(step)
            finally:
                self._discard_unverified(verified)
            yield event
            step += 1
            if reason is None:
                reason = self._finish_reason_before_step()
        yield DoneEvent(reason, self.stats.snapshot(self._clock() - self.start,
                                                    self.target.threads))

    def _step(self, step: int) -> Generator[TokenEvent, None, _StepEnd]:
        """Draft, verify and emit one step's tokens; returns the step's event (with the turn's
        statistics so far) and why the reply ends with it (None: it goes on)."""
        proposal, granted, draft_s = self._draft()
        started = self._clock()
        if self.constraint is None:
            n_accepted, next_token = self._verify(proposal)
        else:
            proposal, n_accepted, next_token = self._verify_constrained(self.constraint, proposal)
        verify_s = self._clock() - started
        k = len(proposal.tokens)
        reason = None
        for token, source in _emitted(proposal.tokens, n_accepted, next_token):
            if token in self.target.stop_ids:
                reason = FinishReason.STOP
                break
            yield self._emit(token, source, step)
            if self.emitted >= self.settings.max_tokens:
                reason = FinishReason.LENGTH
                break
        scores, scoring_s = self._score_emitted()
        draft_s += scoring_s
        self.stats.record_step(k, n_accepted, draft_s, verify_s)
        self.policy.observe(StepOutcome(proposal.source, k, n_accepted, draft_s, verify_s,
                                        scores))
        stats = self.stats.snapshot(self.now - self.start, self.target.threads)
        return StepEvent(step, granted, k, n_accepted, draft_s, verify_s, proposal.source,
                         self.policy.adaptive, stats), reason

    def _clock(self) -> float:
        """``time.perf_counter()``, kept as the latest reading (``now``)."""
        self.now = time.perf_counter()
        return self.now

    def _read_prompt(self) -> Iterator[PromptProgressEvent]:
        """Bring the target's cache up to the prompt minus its last token (fed with the first
        step), ``PROMPT_CHUNK`` tokens at a time: progress after each chunk of a prompt longer
        than one, and a stop between two once ``cancel`` is set. The prompt's time runs from
        here to the end of ``_prefill`` (or of the reply, when it stops here)."""
        self.prompt_started = self._clock()
        for done, total in evaluate_in_chunks(self.target, self.tokens[:-1], PROMPT_CHUNK):
            if total > PROMPT_CHUNK:
                yield PromptProgressEvent(done, total)
            if self.cancel.is_set():
                return

    def _prefill(self) -> PromptEvent:
        """Start the policy's turn and the drafter's reply (the target has read the prompt)."""
        self.policy.start_turn()
        if self.drafter is not None:
            self.drafter.prefill(self.tokens[:-1], self.hints)
        self.stats.prompt_s = self._clock() - self.prompt_started
        return PromptEvent(len(self.tokens), self.stats.prompt_s)

    def _finish_reason_before_step(self) -> FinishReason | None:
        if self.cancel.is_set():
            return FinishReason.CANCELLED
        if self.emitted >= self.settings.max_tokens or len(self.tokens) >= self.target.n_ctx:
            return FinishReason.LENGTH
        if self.constraint is not None and self.constraint.finished:
            return FinishReason.STOP  # the target's masked law would draw a stop token
        return None

    def _draft(self) -> tuple[Proposal, int, float]:
        """The step's proposal (within the policy's budget and the room left; empty when the
        drafter is not asked), the step's K, and the seconds spent drafting.

        The K is the budget the policy gave the source that proposed, 0 for a plain step; on the
        reply's last token, where no draft fits, it is the previous step's (the K in force)."""
        empty = Proposal.empty(self.target.vocab_size)
        room = min(self.settings.max_tokens - self.emitted, self.target.n_ctx - len(self.tokens))
        if self.drafter is None or room <= 1:
            return empty, self.last_k, 0.0  # last_k stays 0 without a drafter
        budget = self.policy.budget()
        self.last_k = 0
        if not budget.asks_drafter:
            return empty, 0, 0.0
        started = self._clock()
        proposal = self.drafter.propose(self.tokens, budget.capped(room - 1),
                                        self.settings.sampling, self.rng)
        proposal = proposal.cut(budget.cut(proposal.source, len(proposal.tokens)))
        draft_s = self._clock() - started
        self.last_k = budget.for_source(proposal.source) if proposal.tokens else 0
        return proposal, self.last_k, draft_s

    def _score_emitted(self) -> tuple[tuple[ShadowScore, ...], float]:
        """The drafter's would-be outcomes that the step's emitted tokens decided
        (``Drafter.score_emitted``), and the seconds that took (the drafter's work: counted
        with the step's drafting); nothing for a policy that does not learn (a fixed K: its
        plain steps stay plain decoding, and the drafter catches up when it is next asked)."""
        if self.drafter is None or not self.policy.adaptive:
            return (), 0.0
        started = self._clock()
        scores = self.drafter.score_emitted(self.tokens)
        return scores, self._clock() - started

    def _verify(self, proposal: Proposal, masks: np.ndarray | None = None,
                refused: np.ndarray | None = None) -> tuple[int, int]:
        """Verify ``proposal`` with one target forward: ``(n_accepted, next_token)``. With
        ``masks`` (a row per verified position), against the target's law restricted to the
        tokens they allow; ``refused``: as ``verify`` takes it."""
        k = len(proposal.tokens)
        logits = evaluate_sequence(self.target, self.tokens + proposal.tokens, k + 1)
        sampling = self.settings.sampling
        if sampling.greedy:
            masked = logits if masks is None else masked_logits(logits, masks)
            return verify_greedy(proposal.tokens, greedy_tokens(masked))
        target_probs = (probabilities(logits, sampling) if masks is None
                        else constrained_probabilities(logits, masks, sampling))
        return verify(proposal.tokens, proposal.probs, target_probs, self.rng, refused)

    def _verify_constrained(self, constraint: TokenConstraint, proposal: Proposal
                            ) -> tuple[Proposal, int, int]:
        """``_verify`` of ``proposal`` cut at its first token ``constraint`` refuses (the
        proposal verified, ``n_accepted``, ``next_token``); the constraint then stands after the
        tokens the step emits: back over the rejected drafts, on over the token drawn."""
        draft = constrain_draft(constraint, proposal)
        n_accepted, token = self._verify(draft.proposal, draft.masks, draft.refused)
        constraint.rollback(len(draft.proposal.tokens) - n_accepted)
        constraint.consume(token)
        return draft.proposal, n_accepted, token

    def _discard_unverified(self, verified: int) -> None:
        """Roll both caches back to the emitted history: rejected or unemitted drafts go now."""
        rollback_to_prefix(self.target, self.tokens, verified)
        if self.drafter is not None:
            self.drafter.rollback(self.tokens, verified)

    def _emit(self, token: int, source: TokenSource, step: int) -> TokenEvent:
        self.tokens.append(token)
        self.emitted += 1
        self.stats.tokens += 1
        if self.emitted == 1:
            self.stats.ttft_s = self._clock() - self.start
        return TokenEvent(token, self.text.push(self.target.token_bytes(token)), source, step)


def _emitted(drafts: list[int], n_accepted: int, next_token: int
             ) -> Iterator[tuple[int, TokenSource]]:
    """The tokens a verified step emits, each with where it came from."""
    for token in drafts[:n_accepted]:
        yield token, TokenSource.ACCEPTED
    if not drafts:
        yield next_token, TokenSource.TARGET
    elif n_accepted < len(drafts):
        yield next_token, TokenSource.RESAMPLED
    else:
        yield next_token, TokenSource.BONUS
