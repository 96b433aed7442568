"""A native crash ends in one readable line and a log, never silently (``chatapp.crash_guard``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatapp.crash_guard import crash_line

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
REPO = Path(__file__).parent.parent


def supervised(body: str, log: Path, sigint_ignored: bool = False,
               **kwargs) -> subprocess.Popen[str]:
    """``body`` (Python) as the supervised run of a fresh process, Ctrl-C raising
    KeyboardInterrupt as when started from a terminal, or with ``sigint_ignored`` ignored as in
    a background job of a script (whatever the tests themselves were started with: a CI may run
    them as such a job)."""
    sigint = "signal.SIG_IGN" if sigint_ignored else "signal.default_int_handler"
    code = ("import signal, sys\nfrom chatapp.crash_guard import supervised\n"
            f"signal.signal(signal.SIGINT, {sigint})\n"
            "def run():\n" + "".join(f"    {line}\n" for line in body.splitlines()) +
            "sys.exit(supervised(run))\n")
    env = {**os.environ, "SPECCHAT_CRASH_LOG": str(log)}
    env.pop("SPECCHAT_NO_SUPERVISOR", None)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_a_segfault_in_native_code_is_one_line_and_a_log(tmp_path: Path) -> None:
    log = tmp_path / "state" / "crash.log"
    process = supervised("import ctypes\nreturn ctypes.string_at(0)", log)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGSEGV
    lines = err.strip().splitlines()
    assert lines == [crash_line(signal.SIGSEGV, log)]
    assert "SIGSEGV" in lines[0] and str(log) in lines[0] and "saved" in lines[0]
    details = log.read_text()
    assert "Segmentation fault" in details and "string_at" in details
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.parent.stat().st_mode & 0o777 == 0o700


def test_an_ordinary_exit_passes_through(tmp_path: Path) -> None:
    process = supervised("print('hello')\nreturn 3", tmp_path / "crash.log")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 3 and out == "hello\n" and err == ""


def test_a_sigterm_to_the_parent_reaches_the_child(tmp_path: Path) -> None:
    marker = tmp_path / "child-stopped"
    body = (f"import signal, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').close(), "
            f"sys.exit(7)))\n"
            f"print('ready', flush=True)\n"
            f"time.sleep(60)")
    process = supervised(body, tmp_path / "crash.log")
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 7 and marker.exists() and err == ""


def test_a_sigint_sent_to_the_parent_alone_reaches_the_child(tmp_path: Path) -> None:
    """``kill -INT`` from a script (no terminal: a session of its own) stops the child as a
    Ctrl-C would; a Ctrl-C typed at a terminal reaches both already and is not passed on."""
    marker = tmp_path / "child-interrupted"
    body = (f"import time\n"
            f"try:\n"
            f"    print('ready', flush=True)\n"
            f"    time.sleep(60)\n"
            f"except KeyboardInterrupt:\n"
            f"    open({str(marker)!r}, 'w').close()\n"
            f"    return 5")
    process = supervised(body, tmp_path / "crash.log", start_new_session=True)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 5 and marker.exists() and err == ""


def test_a_sigint_ignored_from_the_start_stays_ignored(tmp_path: Path) -> None:
    """A background job of a script starts with SIGINT ignored: the parent does not pass it on,
    and the app keeps running until told to stop otherwise."""
    body = ("import time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)")
    process = supervised(body, tmp_path / "crash.log", sigint_ignored=True,
                         start_new_session=True)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 7 and err == ""


def test_sigkill_says_it_is_often_memory() -> None:
    line = crash_line(signal.SIGKILL, Path("x"))
    assert line is not None and "memory" in line
    assert crash_line(signal.SIGTERM, Path("x")) is None


def test_the_command_itself_is_supervised(tmp_path: Path) -> None:
    """`python -m chatapp` (what the `specchat` script runs) forks: the app is a child."""
    env = {**os.environ, "SPECCHAT_CRASH_LOG": str(tmp_path / "crash.log")}
    process = subprocess.Popen([sys.executable, "-m", "chatapp", "models"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "qwen2.5-coder-1.5b" in out
    assert "started" in (tmp_path / "crash.log").read_text()  # the child armed faulthandler


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    """Issue 35, item 11: SIGKILL of the guard's parent used to leave the serving child
    holding its port."""
    process = supervised("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)",
                         tmp_path / "crash.log")
    child = int(process.stdout.readline())
    process.kill()
    process.wait(10)
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its parent")


def test_the_crash_log_leaves_the_api_key_out(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    code = ("import sys\nfrom chatapp.crash_guard import supervised\n"
            "sys.argv = ['specchat', 'serve', '--api-key', 's3cret-1', '--api-key=s3cret-2']\n"
            "sys.exit(supervised(lambda: 0))\n")
    env = {**os.environ, "SPECCHAT_CRASH_LOG": str(log)}
    env.pop("SPECCHAT_NO_SUPERVISOR", None)
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=60)
    text = log.read_text()
    assert "s3cret" not in text and "--api-key *** --api-key=***" in text
