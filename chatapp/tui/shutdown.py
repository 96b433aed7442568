"""How the app ends: ctrl+q, the terminal closed (SIGHUP), the system asking (SIGTERM), a crash.

Every way out stops a streaming reply and saves it as it stands (stopped), closes the models
and the history. ``ShutdownMixin`` is part of ``SpecChatApp``; it needs the app's ``chat`` (a
``chatapp.chat.conversation.Conversation``) and its ``on_quit_while_loading`` hook.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
from typing import Any

# Signals that end the app like ctrl+q (the reply stopped and saved, the history closed): the
# terminal was closed (SIGHUP), the system or a process manager asks it to end (SIGTERM).
QUIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM")
                     if hasattr(signal, name))


class ShutdownMixin:
    """The app's exit, quit action and signal handling."""

    _signal_handlers: dict[int, Any]

    def exit(self, result: int | None = None, return_code: int = 0,
             message: Any = None) -> None:
        """Stop a streaming reply and save it as it stands (stopped), then exit."""
        self.chat.stop_and_save()
        super().exit(result, return_code, message)  # type: ignore[misc]

    def _install_signal_handlers(self) -> None:
        """Quit like ctrl+q on SIGHUP and SIGTERM: by default they end the process at once, and
        the reply streaming then is lost. Needs the app's loop in the main thread (as ``run``
        has it); elsewhere the signals keep their handlers."""
        self._signal_handlers = {}
        loop = asyncio.get_running_loop()
        for signum in QUIT_SIGNALS:
            previous = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, self._quit_on_signal, signum)
            except (ValueError, RuntimeError, NotImplementedError):
                continue
            self._signal_handlers[signum] = previous

    def _remove_signal_handlers(self) -> None:
        if not getattr(self, "_signal_handlers", None):
            return
        loop = asyncio.get_running_loop()
        for signum, previous in self._signal_handlers.items():
            try:
                loop.remove_signal_handler(signum)
                if previous is not None:
                    signal.signal(signum, previous)
            except (ValueError, RuntimeError):
                pass
        self._signal_handlers.clear()

    def _quit_on_signal(self, signum: int) -> None:
        """The terminal was closed, or the system asks the app to end: stop the reply, save it
        as it stands, close the history and exit (status 128 + the signal, as a shell reports a
        process ended by a signal)."""
        if signum == getattr(signal, "SIGHUP", None) and _terminal_hung_up():
            # Nothing can be shown or restored any more, and Textual's shutdown would write to
            # the dead terminal: its output thread ends at the first failed write, and the app
            # then waits for it forever. Save, close the history and leave at once.
            self.chat.stop_and_save()
            if self.chat.history is not None:
                self.chat.history.close()
            os._exit(128 + signum)
        self.exit(return_code=128 + signum)

    async def action_quit(self) -> None:
        """Quit. A model load cannot be interrupted: the app says so and quits when it ends
        (a second ctrl+q leaves at once, and the process exits when the load is over)."""
        if self.is_loading and not self._quit_when_loaded:
            self._quit_when_loaded = True
            self.on_quit_while_loading()
            return
        self.exit()

    def on_unmount(self) -> None:
        self._remove_signal_handlers()
        self.chat.close()  # an exit that did not pass through ``exit`` (a crash) saves too
        if self.chat.history is not None:
            self.chat.history.close()


def _terminal_hung_up() -> bool:
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
