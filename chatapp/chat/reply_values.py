"""What a reply keeps of how it went, as values, formatted only for display: how it ended
(``Ending``: the engine's finish reasons and the conversation's ``error``) and the draft length
it used (``DraftLengthUse``, saved as numbers: ``{"mode": "auto", "start": 4, "ks": [2, 5]}``).

Chats saved before these were values keep their strings: ``Ending`` reads the same words, and a
saved K that is a string (``"auto 2–5"``) is shown as it was written (``k_text``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chatapp.engine.events import FinishReason


class Ending(StrEnum):
    """How a reply ended: the engine's ``FinishReason`` values, or ``ERROR`` (the models failed
    while it streamed: what it made so far is kept)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"

    @classmethod
    def of(cls, reason: FinishReason) -> "Ending":
        """The engine's ``reason`` as an ending."""
        return cls(reason.value)

    @property
    def text(self) -> str:
        """The words every place that shows the ending uses."""
        return _TEXTS[self]


_TEXTS = {Ending.STOP: "done", Ending.LENGTH: "cut at max tokens", Ending.CANCELLED: "stopped",
          Ending.ERROR: "failed"}


def finish_text(finish_reason: str | None) -> str:
    """The words for a stored finish reason ("" for None, a reply still streaming, or an unknown
    one)."""
    try:
        return Ending(finish_reason).text if finish_reason else ""
    except ValueError:
        return ""


def k_label(k: int, adaptive: bool, ks: Sequence[int] = ()) -> str:
    """The draft length as the front ends show it, formatted here only: ``k`` is the K in force
    (when a reply started), ``adaptive`` whether the policy chooses it, ``ks`` the K of each step
    of a reply so far. Before a step: "3", or "auto(3)"; after: the fixed K ("3"), "3→5" when the
    user changed it while the reply streamed, or an adaptive policy's range ("auto 2–5")."""
    if not ks:
        return f"auto({k})" if adaptive else str(k)
    if adaptive:
        low, high = min(ks), max(ks)
        return f"auto {low}" if low == high else f"auto {low}–{high}"
    if min(ks) == max(ks) == k:
        return str(k)
    return f"{k}→{ks[-1]}"


@dataclass(frozen=True)
class DraftLengthUse:
    """The draft length a reply used: ``adaptive`` (the policy chose it), ``start`` (the K in
    force when the reply started) and ``ks``, its steps' K with consecutive repeats as one
    (all that ``k_label`` reads)."""

    adaptive: bool
    start: int
    ks: tuple[int, ...] = ()

    @classmethod
    def of_steps(cls, adaptive: bool, start: int, ks: Sequence[int]) -> "DraftLengthUse":
        return cls(adaptive, start, tuple(k for i, k in enumerate(ks) if i == 0 or k != ks[i - 1]))

    @property
    def label(self) -> str:
        return k_label(self.start, self.adaptive, self.ks)

    def to_json(self) -> dict[str, Any]:
        return {"mode": "auto" if self.adaptive else "fixed", "start": self.start,
                "ks": list(self.ks)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DraftLengthUse":
        """The value ``to_json`` wrote; ``ValueError`` or ``TypeError`` for anything else."""
        if data.get("mode") not in ("auto", "fixed"):
            raise ValueError(f"no draft length mode in {data!r}")
        ks = tuple(int(k) for k in data.get("ks", ()))
        return cls(data["mode"] == "auto", int(data.get("start", ks[0] if ks else 0)), ks)


def k_text(saved: object) -> str:
    """A reply's saved draft length (``meta["k"]``) as shown: a ``DraftLengthUse``'s label, or
    what a chat saved before K was a value holds (a label, or a configured K)."""
    if isinstance(saved, dict):
        try:
            return DraftLengthUse.from_json(saved).label
        except (ValueError, TypeError, KeyError):
            return ""
    return "" if saved is None else str(saved)
