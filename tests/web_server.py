"""`specchat web --no-open` in a subprocess for the tests (tests/test_web.py): its app processes on
fake backends (tests/web_launcher.py), its URL, secret and port read from what it prints."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class WebServer:
    """`specchat web --no-open` in a subprocess, its app processes on fake backends."""

    def __init__(self, tmp_path: Path) -> None:
        self.starts = tmp_path / "app-starts"  # each app process appends its pid
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.web_launcher", "serve", str(self.starts),
             str(tmp_path / "history.sqlite3"), "--no-open"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        line = self._read_line(timeout=15)
        match = re.search(rb"http://127\.0\.0\.1:(\d+)/([A-Za-z0-9_-]+)/", line)
        assert match, f"no URL in {line!r}"
        self.url = match.group(0).decode()
        self.port, self.secret = int(match.group(1)), match.group(2).decode()
        self.host = f"127.0.0.1:{self.port}"
        self.origin = f"http://{self.host}"
        self.stderr = b""

    def _read_line(self, timeout: float) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        assert ready, "specchat web printed no URL in time"
        return stdout.readline()

    def app_pids(self) -> list[int]:
        return [int(line) for line in self.starts.read_text().split()] if self.starts.exists() \
            else []

    def wait_for_apps(self, count: int, timeout: float = 15) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(self.app_pids()) < count:
            assert time.monotonic() < deadline, f"{count} app process(es) never started"
            time.sleep(0.05)
        return self.app_pids()

    def stop(self, signum: int = signal.SIGINT) -> int:
        """Ctrl+C (or ``signum``); the exit status (the test fails if it takes more than 15 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            _, self.stderr = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise AssertionError("specchat web did not stop on SIGINT") from None
        return self.process.returncode
