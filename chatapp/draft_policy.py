"""How many tokens to draft at each speculation step.

A policy is read by the engine at the start of every step (``next_k``) and told what happened
after it (``observe``). The UI changes a policy from another thread while a reply streams; the
change applies from the next step.
"""

from __future__ import annotations

import threading
from typing import Protocol

MAX_DRAFT_LENGTH = 16


class DraftPolicy(Protocol):
    @property
    def label(self) -> str:
        """What the UI shows: the fixed K, or "auto(K)"."""
        ...

    def next_k(self) -> int: ...

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


class FixedDraftLength:
    """A draft length K set by the user (0 = plain target decoding); thread-safe."""

    def __init__(self, k: int) -> None:
        self._lock = threading.Lock()
        self._k = _checked(k)

    @property
    def label(self) -> str:
        return str(self.next_k())

    def next_k(self) -> int:
        with self._lock:
            return self._k

    def set(self, k: int) -> int:
        """Set K, clamped to 0..MAX_DRAFT_LENGTH; returns the value now in force."""
        with self._lock:
            self._k = min(max(k, 0), MAX_DRAFT_LENGTH)
            return self._k

    def adjust(self, delta: int) -> int:
        with self._lock:
            self._k = min(max(self._k + delta, 0), MAX_DRAFT_LENGTH)
            return self._k

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """A fixed policy does not adapt."""


def _checked(k: int) -> int:
    if not 0 <= k <= MAX_DRAFT_LENGTH:
        raise ValueError(f"draft length must be between 0 and {MAX_DRAFT_LENGTH}, got {k}")
    return k
