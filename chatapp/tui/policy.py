"""The draft policy the engine sees, with a handle the UI can adjust or swap while a reply streams.

The engine keeps the policy object it was given for the whole turn and reads ``next_k`` at every
step, so swapping what stands behind this handle (a fixed K instead of an adaptive policy, or a
new policy from Settings) applies from the next step. Thread-safe: the engine runs in a worker.
"""

from __future__ import annotations

import re
import threading

from chatapp.draft_policy import MAX_DRAFT_LENGTH, DraftPolicy, FixedDraftLength


class SwitchablePolicy:
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
    def label(self) -> str:
        return self.inner.label

    def next_k(self) -> int:
        return self.inner.next_k()

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.inner.observe(k, accepted, draft_s, verify_s)

    def __getattr__(self, name: str) -> object:
        """Anything else the engine may ask of a policy goes to the policy behind the handle."""
        if name.startswith("__") or name in ("_inner", "_lock"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def adjust(self, delta: int, current: int | None = None) -> int:
        """Raise or lower K by ``delta``; returns the K now in force.

        A policy with ``adjust`` (a fixed K) is adjusted in place. Any other policy (an adaptive
        one) is replaced by a fixed K starting from ``current`` (the K of the latest step), or
        from the number in its label.
        """
        with self._lock:
            inner = self._inner
            adjust = getattr(inner, "adjust", None)
            if callable(adjust):
                return int(adjust(delta))
            start = current if current is not None else k_from_label(inner.label)
            fixed = FixedDraftLength(min(max(start + delta, 0), MAX_DRAFT_LENGTH))
            self._inner = fixed
            return fixed.next_k()


def k_from_label(label: str) -> int:
    """The last number in a policy label ("3" -> 3, "auto(4)" -> 4, "auto" -> 0)."""
    numbers = re.findall(r"\d+", label)
    return int(numbers[-1]) if numbers else 0
