"""The signals that end the app like ctrl+q: the terminal closed (SIGHUP), the system asking
(SIGTERM).

By default they end the process at once, and a reply streaming then is lost. ``QuitSignals``
routes them to a handler of the app's (which stops the reply, saves it and exits) while the app
runs, and gives them their handlers back after. ``terminal_hung_up`` tells a closed terminal
(nothing can be drawn any more) from a request to end.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
from collections.abc import Callable
from typing import Any

# Signals that end the app like ctrl+q (the reply stopped and saved, the history closed): the
# terminal was closed (SIGHUP), the system or a process manager asks it to end (SIGTERM).
QUIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM")
                     if hasattr(signal, name))


class QuitSignals:
    """``install(handler)`` routes the quit signals to ``handler(signum)`` on the running loop;
    ``remove`` restores what they had. Needs the loop in the main thread (as ``App.run`` has
    it); elsewhere the signals keep their handlers."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def install(self, handler: Callable[[int], None]) -> None:
        loop = asyncio.get_running_loop()
        for signum in QUIT_SIGNALS:
            previous = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, handler, signum)
            except (ValueError, RuntimeError, NotImplementedError):
                continue
            self._previous[signum] = previous

    def remove(self) -> None:
        if not self._previous:
            return
        loop = asyncio.get_running_loop()
        for signum, previous in self._previous.items():
            try:
                loop.remove_signal_handler(signum)
                if previous is not None:
                    signal.signal(signum, previous)
            except (ValueError, RuntimeError):
                pass
        self._previous.clear()


def terminal_hung_up() -> bool:
    """Whether the terminal the app draws on (stderr, as Textual has it) was closed: its
    descriptor then polls as hung up, or as an error for a pipe nobody reads."""
    stream = sys.__stderr__
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):
        return False
    if fd < 0:
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poll.poll(0))


def quit_on_signal(app: Any, signum: int) -> None:
    """The terminal was closed, or the system asks the chat app ``app`` to end: stop the reply,
    save it as it stands, close the history and exit (status 128 + the signal, as a shell reports
    a process ended by a signal)."""
    if signum == getattr(signal, "SIGHUP", None) and terminal_hung_up():
        # Nothing can be shown or restored any more, and Textual's shutdown would write to
        # the dead terminal: its output thread ends at the first failed write, and the app
        # then waits for it forever. Save, close the history and leave at once.
        app.chat.stop_and_save()
        app.chat.chats.close()
        os._exit(128 + signum)
    app.exit(return_code=128 + signum)
