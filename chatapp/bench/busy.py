"""CPU-bound helper processes, to measure decoding on a busy machine (`specchat bench --busy N`).

Each process spins in pure Python until ``stop()``, the deadline it was given, or the death of the
process that started it, whichever comes first, so none outlives the bench.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import TracebackType

_SPIN = """
import os, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
while time.time() < deadline and os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


class BusyProcesses:
    """``with BusyProcesses(n, max_s):`` keeps ``n`` cores busy inside the block."""

    def __init__(self, count: int, max_s: float) -> None:
        if count < 0 or max_s <= 0:
            raise ValueError(f"need count >= 0 and max_s > 0, got {count} and {max_s}")
        self.count = count
        self.max_s = max_s
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        deadline = time.time() + self.max_s
        for _ in range(self.count):
            self._processes.append(subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(deadline), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for process in self._processes:
            process.kill()
        for process in self._processes:
            process.wait(timeout=10)
        self._processes.clear()

    @property
    def running(self) -> int:
        return sum(process.poll() is None for process in self._processes)

    def __enter__(self) -> "BusyProcesses":
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
