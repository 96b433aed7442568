"""A pace for work that the screen shows: however often it is asked for, it runs at most once
per interval, so that a reply streaming at any rate costs the UI thread at most that many frames
a second (the engine decodes beside it on the same CPU)."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.message_pump import MessagePump
from textual.timer import Timer


class Pacer:
    """Runs ``action`` when asked (``ask``), at most once every ``interval_s`` seconds: at once
    when its last run is that long ago, else once the interval is over (the asks meanwhile are
    served by that one run). ``run_now`` runs it at once; ``cancel`` drops a run that waits.
    The timer is ``owner``'s (it stops with it)."""

    def __init__(self, owner: MessagePump, interval_s: float, action: Callable[[], None]) -> None:
        self.owner = owner
        self.interval_s = interval_s
        self.action = action
        self._last = -interval_s
        self._timer: Timer | None = None

    def ask(self) -> None:
        if self._timer is not None:
            return
        wait = self._last + self.interval_s - time.monotonic()
        if wait <= 0:
            self.run_now()
        else:
            self._timer = self.owner.set_timer(wait, self.run_now)

    def run_now(self) -> None:
        self.cancel()
        self._last = time.monotonic()
        self.action()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
