"""Stop sequences of an API request: the reply ends where one of them starts, and never shows it.

``StopScanner`` takes the reply's pieces (text, token source) as they stream and releases the
ones that cannot be the start of a stop sequence; what might be is held back until the next
pieces decide. Once a stop sequence is complete, the reply is cut just before it (a piece is split
there if need be) and ``matched`` is set: nothing more is released.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatapp.engine.events import TokenSource

Piece = tuple[str, TokenSource]


class StopScanner:
    """See the module docstring; without stop sequences every piece passes at once."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self.matched = False
        self._held: list[Piece] = []

    def push(self, piece: Piece) -> list[Piece]:
        """Take the next piece; returns the pieces that may be shown now (in order)."""
        if self.matched:
            return []
        if not self.stops:
            return [piece]
        self._held.append(piece)
        text = "".join(part for part, _ in self._held)
        found = [at for at in (text.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self.matched = True
            return self._release(min(found))
        return self._release(len(text) - self._undecided(text))

    def flush(self) -> list[Piece]:
        """The reply ended without a stop sequence: what was held back, in order."""
        if self.matched:
            return []
        held, self._held = self._held, []
        return held

    def _undecided(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins a stop sequence."""
        for size in range(min(len(text), max(map(len, self.stops)) - 1), 0, -1):
            tail = text[len(text) - size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0

    def _release(self, length: int) -> list[Piece]:
        """The held pieces up to ``length`` characters (the last one split there); the rest
        stays held."""
        held, used = self._held, 0
        for index, (text, source) in enumerate(held):
            if used + len(text) <= length:
                used += len(text)
                continue
            take = length - used
            out = held[:index] + ([(text[:take], source)] if take else [])
            self._held = [(text[take:], source)] + held[index + 1:]
            return out
        self._held = []
        return held
