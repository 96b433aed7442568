"""`specchat serve` on fake backends, and a handle on a server process for the tests.

    python -m tests.serve_launcher [--fake-delay S] [--fake-endless] [--fake-max-tokens N]
                                   [--fake-load-delay S] [--fake-fim] [--head-timeout S]
                                   [--max-connections N] [--body-timeout S] SERVE OPTIONS...
        `specchat serve SERVE OPTIONS` (cli.main), its models the fakes of tests/conftest.py:
        the exact fake target, and the default drafter (speculative edits, the suffix index,
        prompt lookup, then a noisy fake draft model; ``--fake-fim``: both with
        fill-in-the-middle tokens); ``--head-timeout``,
        ``--max-connections`` and ``--body-timeout`` replace the server's limits

``ServeProcess`` starts either (this launcher, or the real `python -m chatapp.cli serve`) on a
free port of 127.0.0.1 and reads the address it prints. Run from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_N_CTX = 4096  # the fakes' window for n_ctx "auto"
FAKE_MODEL_OPTIONS = ["--draft", "fake-draft", "--target", "fake-target", "-k", "3",
                      "--drafter", "ngram+model", "--temperature", "0", "--seed", "0"]


def fake_factory(max_tokens: int, delay_s: float, endless: bool,  # noqa: ANN201
                 load_delay_s: float = 0.0, fim: bool = False):
    """A session factory on fakes with the default drafter, as ``build_session`` makes it
    (``load_delay_s``: loading takes that long; ``fim``: the fakes have fill-in-the-middle
    tokens)."""
    from chatapp.backends.fake import FakeBackend
    from chatapp.chat.reply_settings import generation_settings
    from chatapp.chat.session import ChatSession
    from chatapp.drafters.combined import NgramModelDrafter
    from chatapp.drafters.edits import line_end_test
    from chatapp.drafters.lookup import NgramDrafter
    from chatapp.drafters.model import ModelDrafter
    from chatapp.drafters.suffix import SuffixSource
    from chatapp.drafters.suffix_index import HistoryCorpus
    from chatapp.engine.loop import SpeculativeEngine
    from tests.conftest import EndlessFakeBackend

    def factory(config, progress):  # noqa: ANN001, ANN202
        time.sleep(load_delay_s)
        n_ctx = config.context_tokens or FAKE_N_CTX
        target = (EndlessFakeBackend if endless else FakeBackend)(n_ctx=n_ctx, delay_s=delay_s,
                                                                  fim=fim)
        ngram = NgramDrafter(target.vocab_size, suffix=SuffixSource(HistoryCorpus()),
                             ends_line=line_end_test(target.token_bytes))
        drafter = NgramModelDrafter(ngram, ModelDrafter(FakeBackend(noise=1.0, fim=fim,
                                                                    n_ctx=n_ctx)))
        settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        return ChatSession(SpeculativeEngine(target, drafter), settings, seed=0,
                           system_prompt=config.system_prompt, takes_prediction=True)

    return factory


def main(argv: Sequence[str]) -> int:
    import chatapp.serve.command
    from chatapp.cli import main as cli_main

    parser = argparse.ArgumentParser()
    parser.add_argument("--fake-delay", type=float, default=0.0)
    parser.add_argument("--fake-endless", action="store_true")
    parser.add_argument("--fake-max-tokens", type=int, default=40)
    parser.add_argument("--fake-load-delay", type=float, default=0.0)
    parser.add_argument("--fake-fim", action="store_true")
    parser.add_argument("--head-timeout", type=float)
    parser.add_argument("--max-connections", type=int)
    parser.add_argument("--body-timeout", type=float)
    fake, rest = parser.parse_known_args(argv)
    _set_limits(fake)
    serve = chatapp.serve.command.serve_command
    factory = fake_factory(fake.fake_max_tokens, fake.fake_delay, fake.fake_endless,
                           fake.fake_load_delay, fake.fake_fim)
    chatapp.serve.command.serve_command = (  # type: ignore[assignment]
        lambda config, options: serve(config, options, factory))
    return cli_main(["serve", *FAKE_MODEL_OPTIONS, *rest])


def _set_limits(fake: argparse.Namespace) -> None:
    """The server's limits the options give (the modules are imported only then)."""
    if fake.body_timeout is not None:
        import chatapp.serve.app as app
        app.BODY_TIMEOUT_S = fake.body_timeout
    if fake.head_timeout is not None or fake.max_connections is not None:
        import chatapp.serve.connections as connections
        if fake.head_timeout is not None:
            connections.HEAD_TIMEOUT_S = connections.KEEPALIVE_S = fake.head_timeout
        if fake.max_connections is not None:
            connections.MAX_CONNECTIONS = fake.max_connections


class ServeProcess:
    """A `specchat serve` subprocess on 127.0.0.1 (the fake launcher unless ``command``)."""

    def __init__(self, tmp_path: Path, args: Sequence[str] = (),
                 command: Sequence[str] | None = None, env: dict[str, str] | None = None,
                 timeout: float = 60) -> None:
        base = list(command) if command is not None else [
            sys.executable, "-m", "tests.serve_launcher"]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
            XDG_STATE_HOME=str(tmp_path / "state"), **(env or {}))
        self.process = subprocess.Popen(
            [*base, "--port", "0", *args], cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self._read_line(timeout)
        match = re.search(rb"http://127\.0\.0\.1:(\d+)/v1", line)
        if not match:
            self.stop()
            raise AssertionError(f"no address in {line!r}; stderr: {self.stderr!r}")
        self.port = int(match.group(1))
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.host = f"127.0.0.1:{self.port}"
        self.model = line.split(b"(model ", 1)[1].split(b";", 1)[0].decode()
        self.stderr = b""

    def _read_line(self, timeout: float) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.2)
            if ready:
                return stdout.readline()
            if self.process.poll() is not None:
                break
        return b""

    def stop(self, signum: int | None = signal.SIGINT, timeout: float = 15) -> int:
        """Ctrl+C (or ``signum``; None: no signal, the server is stopping already); the exit
        status (AssertionError after ``timeout`` s)."""
        if signum is not None and self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise AssertionError(f"specchat serve did not stop on {signum}") from None
        return self.process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
