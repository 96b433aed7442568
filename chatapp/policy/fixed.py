"""How many tokens to draft at each speculation step: the policy protocol, a fixed K, and the
handle the front ends adjust or swap while a reply streams.

At the start of every step the engine asks the policy for a ``DraftBudget`` (``budget``) and,
after the target's verification, reports a ``StepOutcome`` (``observe``): which source proposed,
how many tokens, how many were accepted, the time each part took, and the would-be outcomes a
free drafter scored. That is all that passes between them: a drafter never calls the policy.
"""

from __future__ import annotations

import threading

from chatapp.engine.contracts import (
    MAX_DRAFT_LENGTH,
    DraftBudget,
    DraftPolicy,
    StepOutcome,
    checked_draft_length,
)


class FixedDraftLength:
    """A draft length K set by the user (0 = plain target decoding) for every source;
    thread-safe."""

    def __init__(self, k: int) -> None:
        self._lock = threading.Lock()
        self._k = checked_draft_length(k)

    @property
    def k(self) -> int:
        with self._lock:
            return self._k

    adaptive = False

    def current_k(self) -> int:
        return self.k

    def budget(self) -> DraftBudget:
        return DraftBudget.uniform(self.k)

    def set(self, k: int) -> int:
        """Set K, clamped to 0..MAX_DRAFT_LENGTH; returns the value now in force."""
        with self._lock:
            self._k = _clamped(k)
            return self._k

    def adjust(self, delta: int) -> int:
        with self._lock:
            self._k = _clamped(self._k + delta)
            return self._k

    def observe(self, outcome: StepOutcome) -> None:
        """A fixed policy does not adapt."""

    def start_turn(self) -> None:
        """A fixed policy does not adapt."""


class SwitchablePolicy:
    """The policy a conversation gives the engine, with what stands behind it swappable.

    The engine keeps the policy object it was given for the whole turn and asks it for a budget
    at every step, so replacing the policy behind this handle (a fixed K instead of an adaptive
    policy, or a new policy from Settings) applies from the next step. Thread-safe: the engine
    runs in a worker while the UI adjusts.
    """

    def __init__(self, inner: DraftPolicy) -> None:
        self._lock = threading.Lock()
        self._inner = inner

    @property
    def inner(self) -> DraftPolicy:
        with self._lock:
            return self._inner

    def replace(self, inner: DraftPolicy) -> None:
        with self._lock:
            self._inner = inner

    @property
    def adaptive(self) -> bool:
        return self.inner.adaptive

    def current_k(self) -> int:
        return self.inner.current_k()

    def budget(self) -> DraftBudget:
        return self.inner.budget()

    def observe(self, outcome: StepOutcome) -> None:
        self.inner.observe(outcome)

    def start_turn(self) -> None:
        self.inner.start_turn()

    def set(self, k: int) -> int:
        """Draft ``k`` tokens (clamped to 0..MAX_DRAFT_LENGTH) from the next step: a fixed K is
        set in place, any other policy is replaced by a fixed K. Returns the K now in force."""
        with self._lock:
            if isinstance(self._inner, FixedDraftLength):
                return self._inner.set(k)
            self._inner = FixedDraftLength(_clamped(k))
            return self._inner.k

    def adjust(self, delta: int, current: int | None = None) -> int:
        """Raise or lower K by ``delta``; returns the K now in force.

        A fixed K is adjusted in place. Any other policy (an adaptive one) is replaced by a fixed
        K starting from ``current`` (the K of the latest step), or from its ``current_k``.
        """
        with self._lock:
            inner = self._inner
            if isinstance(inner, FixedDraftLength):
                return inner.adjust(delta)
            start = current if current is not None else inner.current_k()
            fixed = FixedDraftLength(_clamped(start + delta))
            self._inner = fixed
            return fixed.k


def _clamped(k: int) -> int:
    return min(max(k, 0), MAX_DRAFT_LENGTH)
