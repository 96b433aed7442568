"""A `specchat serve` the measurement tools start themselves, on a free port of 127.0.0.1, and
stop with Ctrl+C's signal once done (a fresh server has an empty in-memory suffix index).

``ServeProcess(command)`` runs ``command + ["--port", "0"]`` (the command is e.g.
``[sys.executable, "-m", "chatapp.cli", "serve", ...model options]``) and reads the address the
server prints on its first line of stdout; ``ValueError`` (with the server's stderr) when none
comes within the timeout.
"""

from __future__ import annotations

import re
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from types import TracebackType

_ADDRESS = re.compile(rb"(http://127\.0\.0\.1:\d+/v1)")
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0


class ServeProcess:
    """See the module docstring; a context manager that stops the server on leaving."""

    def __init__(self, command: Sequence[str], timeout: float = START_TIMEOUT_S) -> None:
        self.process = subprocess.Popen(
            [*command, "--port", "0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        match = _ADDRESS.search(self._first_line(timeout))
        if not match:
            self.stop()
            raise ValueError(f"`{' '.join(command)}` printed no address: "
                             f"{self.stderr.decode('utf-8', 'replace').strip()[-2000:]}")
        self.base_url = match.group(1).decode()
        self.stderr = b""

    def _first_line(self, timeout: float) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if select.select([stdout], [], [], 0.2)[0]:
                return stdout.readline()
        return b""

    def stop(self) -> None:
        """Ctrl+C's signal, and wait (killed after ``STOP_TIMEOUT_S``); keeps its stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            _, self.stderr = self.process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
