"""How much CPU the chat app's UI thread takes while a reply streams:
``python -m benchmarks.render_speed`` (from the repository root).

The whole app (``SpecChatApp``, in a test driver, 120x40 by default, stats panel open) answers the
issue's prompt with a Markdown reply (prose, a Python block with a docstring, a list, a second
block): ~360 tokens that a scripted fake target decodes at ``--rate`` tokens per second (it sleeps
in every evaluation, so the engine thread takes no CPU and the UI thread is measured alone).
``--k`` sets the draft length (0: the target alone, as the issue measured; from 1 a scripted draft
model that errs on every seventh token, so that every tint shows), ``--no-tints`` is F3.

For each run it reads the UI thread's CPU time (``time.thread_time`` on the thread that runs the
app) from the moment the message is sent to the end of the reply, and prints a Markdown table:
the UI's CPU per token and the share of a core it takes at ``--rate`` (its CPU per token times
the rate: a figure that a busy machine, which slows the reply, does not change). On a 2-core
machine with llama.cpp's two decoding threads, that share is what the app takes from decoding.
The frames are encoded for the terminal as in a real one (``TerminalApp``); only writing them to
a terminal (and the terminal's own work) is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from chatapp.backends.fake import STOP_ID, FakeBackend
from chatapp.chat.reply_settings import generation_settings
from chatapp.chat.session import ChatSession
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.loop import SpeculativeEngine
from chatapp.settings.config import Config
from chatapp.tui.app import SpecChatApp

PROMPT = ("Write a Python function that checks whether a string is a valid IPv4 address, with a "
          "docstring.")
REPLY = '''Here is a function that checks whether a string is a valid **IPv4 address**:

```python
def is_valid_ipv4(address: str) -> bool:
    """Return True if `address` is a valid IPv4 address.

    A valid address has four decimal octets separated by dots, each
    between 0 and 255, without leading zeros (so "192.168.01.1" is
    rejected).

    >>> is_valid_ipv4("192.168.1.1")
    True
    >>> is_valid_ipv4("256.0.0.1")
    False
    """
    parts = address.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not part.isdigit():
            return False
        if len(part) > 1 and part.startswith("0"):
            return False
        if int(part) > 255:
            return False
    return True
```

How it works:

1. `split(".")` cuts the address into its *octets*; anything but four parts is invalid.
2. `isdigit()` rejects signs, spaces and empty parts such as `"1..2.3"`.
3. A leading zero is refused, since some parsers read `010` as octal.
4. Each octet must be at most `255`.

You can also use the standard library, which follows the same rules:

```python
import ipaddress

def is_valid_ipv4(address: str) -> bool:
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return True
```

> Note: both versions reject surrounding whitespace; call `address.strip()` first if your
> input may have it.
'''
TOKEN = re.compile(r" ?\w{1,7}|\s*[^\w\s]{1,2}|\s+")


class ScriptedBackend(FakeBackend):
    """A fake model that says ``script`` (token ids of its own vocabulary ``pieces``) after any
    prompt, then stops; ``errors``: every that many tokens it says the next id instead (a draft
    model that the target sometimes rejects; 0: never)."""

    def __init__(self, pieces: Sequence[bytes], script: Sequence[int], delay_s: float,
                 errors: int = 0) -> None:
        super().__init__(vocab_size=len(pieces), delay_s=delay_s)
        self.pieces = list(pieces)
        self.script = list(script)
        self.errors = errors
        self.prompt_length = 0

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return [1 + byte % (len(self.pieces) - 1) for byte in text.encode()]

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        if not self.cached_tokens:  # the prompt's prefill: the reply starts after it
            self.prompt_length = len(tokens) + 1
        return super().evaluate(tokens, n_logits)

    def _logits_after(self, context: Sequence[int]) -> np.ndarray:
        position = len(context) - self.prompt_length
        token = self.script[position] if 0 <= position < len(self.script) else STOP_ID
        if self.errors and position % self.errors == self.errors - 1:
            token = 1 + token % (len(self.pieces) - 1)
        logits = np.zeros(len(self.pieces), dtype=np.float32)
        logits[token] = 30.0
        return logits


class TerminalApp(SpecChatApp):
    """The app as a terminal runs it: each frame is encoded into escape codes (which the test
    driver then drops), as a real terminal's frames are."""

    CSS_PATH = str(Path(inspect.getfile(SpecChatApp)).with_name("specchat.tcss"))

    @property
    def is_headless(self) -> bool:
        return False


def scripted_factory(text: str, rate: float
                     ) -> Callable[[Config, Callable[[str, float | None], None]], ChatSession]:
    """Sessions whose target says ``text`` at ``rate`` evaluations per second."""
    words = TOKEN.findall(text)
    assert "".join(words) == text, "the tokens must spell the reply"
    pieces = [b""] + sorted({word.encode() for word in words})
    script = [pieces.index(word.encode()) for word in words]

    def factory(config: Config, progress: Callable[[str, float | None], None]) -> ChatSession:
        target = ScriptedBackend(pieces, script, delay_s=1.0 / rate)
        draft = ScriptedBackend(pieces, script, delay_s=0.0, errors=7)
        settings = dataclasses.replace(generation_settings(config), max_tokens=len(script) + 8)
        return ChatSession(SpeculativeEngine(target, ModelDrafter(draft)), settings, seed=0)

    return factory


@dataclasses.dataclass(frozen=True)
class Run:
    """One reply: its tokens, its seconds from sending to the end, the UI thread's CPU seconds."""

    tokens: int
    wall_s: float
    ui_cpu_s: float

    @property
    def cpu_per_token_ms(self) -> float:
        return self.ui_cpu_s / self.tokens * 1e3

    def core_share(self, rate: float) -> float:
        """The share of a core the UI takes while a reply streams at ``rate`` tokens/s."""
        return self.ui_cpu_s / self.tokens * rate


async def _wait(predicate: Callable[[], bool], timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.05)


async def measure(k: int, tints: bool, rate: float, size: tuple[int, int]) -> Run:
    """One reply streamed into a fresh app; the UI thread's CPU while it streams."""
    config = Config(draft_length=str(k), drafter="model", seed=0, temperature=0.0)
    with tempfile.TemporaryDirectory() as folder:
        app = TerminalApp(config, session_factory=scripted_factory(REPLY, rate),
                          history_path=Path(folder) / "history.sqlite3",
                          export_dir=Path(folder) / "exports", folder=Path(folder))
        async with app.run_test(size=size) as pilot:
            await _wait(lambda: app.chat.session is not None)
            if not tints:
                await pilot.press("f3")
            await pilot.press("f2")  # the stats panel follows the reply
            await pilot.pause()
            app.chat_input.text = PROMPT
            start_cpu, start = time.thread_time(), time.perf_counter()
            app.simulate_key("enter")
            await _wait(lambda: app.chat.entries and app.chat.turn is None)
            await pilot.pause()
            run = Run(app.chat.entries[-1].stats.tokens, time.perf_counter() - start,
                      time.thread_time() - start_cpu)
            assert app.chat.entries[-1].content == REPLY, "the reply was not the scripted one"
    return run


def report(runs: dict[str, list[Run]], rate: float) -> str:
    """The table of ``runs`` by configuration (medians over the repeats)."""
    lines = ["| configuration | runs | tokens | streamed tok/s | UI CPU s | UI CPU ms/token | "
             f"share of a core at {rate:g} tok/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, done in runs.items():
        def median(value: Callable[[Run], float]) -> float:
            return statistics.median(value(run) for run in done)

        lines.append(f"| {name} | {len(done)} | {done[0].tokens} | "
                     f"{median(lambda r: r.tokens / r.wall_s):.1f} | "
                     f"{median(lambda r: r.ui_cpu_s):.2f} | "
                     f"{median(lambda r: r.cpu_per_token_ms):.2f} | "
                     f"{median(lambda r: r.core_share(rate)):.1%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render_speed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=16.0,
                        help="tokens per second the fake target decodes at (default 16)")
    parser.add_argument("--k", type=int, default=0, help="draft length (default 0)")
    parser.add_argument("--no-tints", action="store_true", help="provenance tints off (F3)")
    parser.add_argument("--both", action="store_true", help="with and without tints, alternated")
    parser.add_argument("--repeats", type=int, default=1, help="replies of each configuration")
    parser.add_argument("--width", type=int, default=120, help="terminal columns")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.k < 0 or args.repeats < 1 or args.width < 60:
        parser.error("need --rate > 0, --k >= 0, --repeats >= 1 and --width >= 60")
    configurations = [True, False] if args.both else [not args.no_tints]
    runs: dict[str, list[Run]] = {}
    for _ in range(args.repeats):
        for tints in configurations:
            name = f"K {args.k}, tints {'on' if tints else 'off'}"
            runs.setdefault(name, []).append(
                asyncio.run(measure(args.k, tints, args.rate, (args.width, 40))))
    print(f"The issue's prompt, a {len(TOKEN.findall(REPLY))}-token Markdown reply at "
          f"{args.rate:g} tok/s, {args.width}x40\n")
    print(report(runs, args.rate))


if __name__ == "__main__":
    main()
