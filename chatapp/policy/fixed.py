"""A fixed draft length K, set by the user (the handle that swaps it for the adaptive policy while
a reply streams is ``chatapp.policy.draft_length.DraftLength``).

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


def _clamped(k: int) -> int:
    return min(max(k, 0), MAX_DRAFT_LENGTH)
