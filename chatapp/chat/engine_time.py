"""A reply's decode rate in the engine: the engine's own clock runs while the consumer of its
stream holds an event (a front end showing the reply, a replay checking for the end), so its
figures count that time too. ``EngineClock`` measures the holding, and the decode rate without
it is what the engine took: the same basis for a reply shown in the app and for its replay at
K = 0, which nothing shows (F8 compares the two). What the app's drawing takes from the CPU beside
the engine is not held time: it stays in the reply's figure (the app keeps it small: see
``chatapp.tui.chat_view``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from chatapp.engine.events import DoneEvent, Event
from chatapp.engine.stats import TurnStats

# What the stats panel says of a replay's speedup, by whether the reply was measured so.
ENGINE_BASIS = ("both decode rates measured in the engine, without the time the app held the "
                "stream to show the reply; the CPU its drawing took beside the engine still counts")
SHOWN_BASIS = ("the reply's decode rate as measured while the app showed it (a reply of an "
               "earlier version), the replay's without: rendering counts against speculation")


@dataclass
class EngineClock:
    """The seconds a consumer held the engine's stream (``follow``) before its ``DoneEvent``:
    all of them within the time the engine's figures cover."""

    held_s: float = 0.0

    def follow(self, events: Iterator[Event]) -> Iterator[Event]:
        """``events`` as they are, timing how long each is held until the next is asked for."""
        for event in events:
            if isinstance(event, DoneEvent):
                yield event
                continue
            handed = time.perf_counter()
            yield event
            self.held_s += time.perf_counter() - handed

    def decode_tokens_per_s(self, stats: TurnStats) -> float:
        """Tokens per second of generation in the engine: the prompt's processing and the time
        the consumer held the stream left out (0 when nothing is left)."""
        decode_s = stats.total_s - stats.prompt_s - self.held_s
        return stats.tokens / decode_s if decode_s > 0 else 0.0
