"""A crash in native code (llama.cpp, PyTorch) is never silent.

``supervised(run)`` forks before anything heavy is imported: the child runs specchat with
``faulthandler`` writing every thread's Python stack to ``crash_log_path()`` should it die from a
signal; the parent only waits. If the child dies from SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT
(or SIGKILL, the out-of-memory killer's signal), the parent puts the terminal back the way it
was before the app started (the app could not) and prints one line: what happened, that the
finished messages are saved (the history writes each one as it ends), and where the details
are. Termination signals sent to the parent (SIGTERM, SIGHUP, SIGQUIT) are passed on to the child;
the terminal's own signals reach both already, so a SIGINT is passed on only where it cannot have
come from the terminal (the parent is not in the terminal's foreground process group, or there is
no terminal: ``kill -INT`` from a script). A SIGINT ignored from the start (a background job of a
script) stays ignored by the app.

Where ``os.fork`` does not exist, or ``SPECCHAT_NO_SUPERVISOR=1`` is set, ``run`` runs in this
process with ``faulthandler`` writing to the same log. The child gets SIGTERM when the parent
dies, even by SIGKILL (Linux), so no orphan keeps serving; the log's header names the command
line with the values of secret options (``--api-key``) left out.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chatapp.user_files import open_private_log, state_dir

CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                           signal.SIGABRT})
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SECRET_OPTIONS = frozenset({"--api-key"})  # their values never go into the crash log
_PR_SET_PDEATHSIG = 1
# Leave the alternate screen, show the cursor, stop mouse reporting and bracketed paste.
_TERMINAL_RESET = "\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\r\n"


def crash_log_path() -> Path:
    """Where the stacks of a native crash go (``~/.local/state/specchat/crash.log`` on Linux);
    ``SPECCHAT_CRASH_LOG`` overrides it."""
    override = os.environ.get("SPECCHAT_CRASH_LOG")
    return Path(override) if override else state_dir() / "crash.log"


def supervised(run: Callable[[], int]) -> int:
    """Run ``run`` so that a native crash ends in one readable line; returns its exit status."""
    if not hasattr(os, "fork") or os.environ.get("SPECCHAT_NO_SUPERVISOR") == "1":
        _log_faults_to(crash_log_path())
        return run()
    terminal = _save_terminal()
    # Held back over the fork, so none arrives before the parent can pass it on (SIGINT too:
    # before its handler is in, it would raise KeyboardInterrupt in the parent).
    held = signal.pthread_sigmask(signal.SIG_BLOCK, (*FORWARDED_SIGNALS, signal.SIGINT))
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        _log_faults_to(crash_log_path())
        return run()
    status = _wait_forwarding_signals(pid, held)
    return _report(status, terminal)


def crash_line(signum: int, log: Path) -> str | None:
    """The one line the user sees after the child died from signal ``signum`` (None: nothing to
    say, e.g. a SIGTERM the user sent)."""
    saved = "Every finished message is saved in the history."
    if signum == signal.SIGKILL:  # what the kernel's out-of-memory killer sends
        return (f"specchat was killed (SIGKILL), most often because the system ran out of memory: "
                f"try smaller models or a smaller --n-ctx. {saved}")
    if signum not in CRASH_SIGNALS:
        return None
    name = signal.Signals(signum).name
    return (f"specchat stopped: a crash in native code ({name}), not caused by anything you did. "
            f"{saved} Details: {log}")


def _die_with(parent: int) -> None:
    """(The child.) Get SIGTERM when ``parent`` dies, even by SIGKILL (Linux's
    ``PR_SET_PDEATHSIG``), so that no orphan keeps a port or the models; if it died already,
    now."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret options (``--api-key``) replaced by ``***``."""
    shown: list[str] = []
    for arg in argv:
        if shown and shown[-1] in SECRET_OPTIONS:
            shown.append("***")
        elif arg.split("=", 1)[0] in SECRET_OPTIONS and "=" in arg:
            shown.append(arg.split("=", 1)[0] + "=***")
        else:
            shown.append(arg)
    return shown


def _log_faults_to(path: Path) -> None:
    """On a fatal signal, append a header and every thread's stack to ``path`` (0600)."""
    try:
        log = open_private_log(path)
    except OSError:
        faulthandler.enable(all_threads=True)  # stderr, better than nothing
        return
    log.write(f"\n--- specchat pid {os.getpid()} started {time.ctime()}: "
              f"{' '.join(redacted(sys.argv))}\n")
    log.flush()
    faulthandler.enable(file=log, all_threads=True)


def _wait_forwarding_signals(pid: int, mask: set[signal.Signals]) -> int:
    """Wait for the child ``pid``, passing termination signals on; its wait status. Ctrl-C is
    the child's to handle (see the module docstring). ``mask``: the signal mask to restore once
    the handlers are in."""
    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    def forward_unless_from_terminal(signum: int, frame: Any) -> None:
        if not _in_terminal_foreground():
            forward(signum, frame)

    signal.signal(signal.SIGINT, forward_unless_from_terminal)
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _in_terminal_foreground() -> bool:
    """Whether this process is in the foreground process group of its controlling terminal (a
    Ctrl-C typed there reaches every process of that group)."""
    try:
        with open("/dev/tty", "rb", buffering=0) as tty:
            return os.tcgetpgrp(tty.fileno()) == os.getpgrp()
    except OSError:
        return False


def _report(status: int, terminal: Any) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    signum = os.WTERMSIG(status)
    line = crash_line(signum, crash_log_path())
    if line is not None:
        _restore_terminal(terminal)
        print(line, file=sys.stderr)
    return 128 + signum


def _save_terminal() -> Any:
    """The terminal's settings before the app changes them (None when stdin is no terminal)."""
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    except (ImportError, OSError, ValueError):
        return None


def _restore_terminal(saved: Any) -> None:
    if saved is None:
        return
    import termios

    try:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        if sys.stdout.isatty():
            sys.stdout.write(_TERMINAL_RESET)
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
