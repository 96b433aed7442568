"""How fast the chat app shows a streaming reply: ``python -m chatapp.bench.render_speed``.

A long Markdown reply (headings, paragraphs with emphasis and inline code, lists, quotes, Python
code blocks; ``--tokens`` pseudo-tokens) streams into a headless app through the reply widget, one
append per speculation step (a few accepted tokens, then a resampled or bonus one, as the engine
emits them), and each append is followed by the frame that shows it (layout and paint). Three
paths, alternated in the same process: the Markdown with provenance tints (``ReplyText``), the
same without tints (F3), and token colours without Markdown (``TokenText``, the app's reply
before the Markdown). Prints a Markdown table: time per append and frame (mean, p95) and tokens
rendered per second.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget

from chatapp.chat.events import TokenSource
from chatapp.tui.reply_text import ReplyText
from chatapp.tui.token_text import TokenText

CSS = Path(__file__).resolve().parent.parent / "tui" / "specchat.tcss"
TOKEN = re.compile(r"\s*\w{1,6}|\s*[^\w\s]{1,3}|\s+")
WORDS = ("draft target token model accept verify sample cache batch layer weight speed reply "
         "stream window prefix kernel thread").split()
CODE = ["def step(tokens, draft, k):", "    accepted = []", "    for i in range(k):",
        "        if draft[i] != tokens[i]:  # rejected here", "            break",
        "        accepted.append(draft[i])", '    return accepted, "done"']
Group = list[tuple[str, TokenSource]]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
    index = rng.randrange(len(words))
    words[index] = rng.choice(("**{}**", "*{}*", "`{}`")).format(words[index])
    return " ".join(words).capitalize() + "."


def reply_text(rng: random.Random, sections: int) -> str:
    """A Markdown reply of ``sections`` sections."""
    parts = []
    for number in range(1, sections + 1):
        parts.append(f"## Step {number}: {rng.choice(WORDS)} and {rng.choice(WORDS)}\n\n")
        parts.append(" ".join(_sentence(rng) for _ in range(4)) + "\n\n")
        parts += [f"- {_sentence(rng)}\n" for _ in range(3)] + ["\n"]
        parts.append("```python\n" + "\n".join(CODE * 2) + "\n```\n\n")
        parts.append(f"> {_sentence(rng)}\n\n")
    return "".join(parts)


def stream_groups(tokens: int, seed: int = 0) -> list[Group]:
    """``tokens`` pseudo-tokens of a Markdown reply in speculation steps: up to 6 accepted
    draft tokens, then the target's resampled token (or a bonus one after all 6)."""
    rng = random.Random(seed)
    text = reply_text(rng, sections=1)
    while len(TOKEN.findall(text)) < tokens:
        text += reply_text(rng, sections=4)
    pieces = TOKEN.findall(text)[:tokens]
    groups: list[Group] = []
    while pieces:
        accepted = rng.randint(0, 6)
        last = TokenSource.BONUS if accepted == 6 else TokenSource.RESAMPLED
        step, pieces = pieces[:accepted + 1], pieces[accepted + 1:]
        groups.append([(piece, TokenSource.ACCEPTED) for piece in step[:-1]]
                      + [(step[-1], last)])
    return groups


class RenderApp(App[None]):
    """A screen with a reply widget to stream into."""

    CSS_PATH = str(CSS)

    def __init__(self, widget: Widget) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.widget


def _widget(path: str) -> ReplyText | TokenText:
    if path == "tokens":
        return TokenText()
    return ReplyText(provenance=path == "provenance")


async def measure(path: str, groups: Sequence[Group], size: tuple[int, int]) -> list[float]:
    """Seconds of each append and the frame that shows it, for one path."""
    widget = _widget(path)
    app = RenderApp(widget)
    times = []
    async with app.run_test(size=size) as pilot:
        scroll = app.query_one(VerticalScroll)
        await pilot.pause()
        for group in groups:
            start = time.perf_counter()
            widget.append(group)
            scroll.scroll_end(animate=False, immediate=True)
            await pilot.pause(0)  # the widget asks for a layout ...
            await pilot.pause(0)  # ... which the screen makes and paints
            times.append(time.perf_counter() - start)
    return times


PATHS = {"provenance": "Markdown + provenance tints", "plain": "Markdown, provenance off (F3)",
         "tokens": "token colours only (TokenText, before)"}


def report(results: dict[str, list[float]], tokens: int) -> str:
    """The table of ``results`` (seconds per append, by path)."""
    lines = ["| path | appends | mean ms | p95 ms | tokens/s |", "|---|---:|---:|---:|---:|"]
    for path, times in results.items():
        p95 = statistics.quantiles(times, n=20)[-1]
        lines.append(f"| {PATHS[path]} | {len(times)} | {statistics.mean(times) * 1e3:.2f} | "
                     f"{p95 * 1e3:.2f} | {tokens / sum(times):,.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chatapp.bench.render_speed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="tokens in the reply")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each path")
    parser.add_argument("--width", type=int, default=120, help="terminal columns")
    args = parser.parse_args(argv)
    if args.tokens < 10 or args.repeats < 1 or args.width < 20:
        parser.error("need --tokens >= 10, --repeats >= 1 and --width >= 20")
    groups = stream_groups(args.tokens)
    results: dict[str, list[float]] = {path: [] for path in PATHS}
    for _ in range(args.repeats):
        for path in PATHS:
            results[path] += asyncio.run(measure(path, groups, (args.width, 40)))
    print(f"{args.tokens} tokens in {len(groups)} appends, {args.width}x40, "
          f"{args.repeats} run(s) of each path\n")
    print(report(results, args.tokens * args.repeats))


if __name__ == "__main__":
    main()
