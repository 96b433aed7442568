"""The stats panel's text: a pure function of one turn's ``TurnStats`` (no widget, no clock)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from chatapp.chat.events import ReplayStats, TurnStats, decode_tokens_per_s, is_target_only
from chatapp.chat.reply_values import finish_text
from chatapp.settings.config import rpc_label

BAR_WIDTH = 14
STYLE_NAMES = ("heading", "muted", "bar", "bar-empty", "draft", "verify", "prompt", "other")


@dataclass(frozen=True)
class TurnInfo:
    """What the panel shows besides the numbers: which turn, at which K, how it ended."""

    title: str
    k_label: str = ""
    finish_reason: str | None = None  # None while streaming
    live: bool = False
    target_rpc: tuple[str, ...] = ()  # the RPC servers that held the target's layers, if any
    replay: ReplayStats | None = None  # this reply decoded again at K = 0, if the user asked
    replay_basis: str = ""  # what the replay's speedup compares (``ChatEntry.replay_basis``)


def bar(fraction: float, width: int = BAR_WIDTH) -> tuple[str, str]:
    """(filled, empty) parts of a bar, in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rest].strip() if rest else ""
    filled = "█" * full + partial
    return filled, "░" * (width - len(filled))


def render_stats(stats: TurnStats | None, info: TurnInfo, baseline_tps: float | None = None,
                 styles: Mapping[str, Style | str] | None = None) -> Text:
    """The panel for one turn. ``baseline_tps``: decode tok/s of a target-only turn measured in
    this session, or None when there is none yet."""
    panel = _Panel({name: "" for name in STYLE_NAMES} | dict(styles or {}))
    panel.header(info)
    if stats is None:
        panel.text.append("\nNo statistics for this message.\n", panel.style["muted"])
        return panel.text
    panel.speculation(stats)
    panel.time(stats)
    panel.speed(stats, info, baseline_tps)
    return panel.text


class _Panel:
    """The panel's text, built section by section."""

    def __init__(self, style: dict[str, Style | str]) -> None:
        self.style = style
        self.text = Text(no_wrap=False, overflow="fold")

    def line(self, label: str, value: str = "", note: str = "") -> None:
        self.text.append(f"{label:<16}")
        self.text.append(value)
        if note:
            self.text.append(f"  {note}", self.style["muted"])
        self.text.append("\n")

    def heading(self, title: str) -> None:
        self.text.append("\n")
        self.text.append(title, self.style["heading"])
        self.text.append("\n")

    def header(self, info: TurnInfo) -> None:
        text, muted = self.text, self.style["muted"]
        text.append(info.title, self.style["heading"])
        state = "streaming…" if info.live else finish_text(info.finish_reason)
        if state:
            text.append(f" · {state}", muted)
        text.append("\n")
        if info.k_label:
            text.append(f"draft length K {info.k_label}\n", muted)
        if info.target_rpc:
            text.append(f"target {rpc_label(info.target_rpc)}\n", muted)

    def speculation(self, stats: TurnStats) -> None:
        self.heading("Speculation")
        self.line("Tokens", f"{stats.tokens}")
        self.line("Drafted", f"{stats.drafted}")
        self.line("Accepted", f"{stats.accepted}",
                  f"{stats.acceptance_rate:.1%}" if stats.drafted else "")
        self.line("Per target call", f"{stats.mean_accepted_length:.2f} tokens",
                  f"{stats.target_calls} target calls")
        if stats.per_position_accepted:
            self.heading("Acceptance by position")
            for position, rate in enumerate(stats.per_position_accepted, 1):
                filled, empty = bar(rate)
                self.text.append(f"{position:>3} ")
                self.text.append(filled, self.style["bar"])
                self.text.append(empty, self.style["bar-empty"])
                self.text.append(f" {rate:4.0%}\n")

    def time(self, stats: TurnStats) -> None:
        self.heading("Time")
        parts = (("draft", stats.draft_s), ("verify", stats.verify_s),
                 ("prompt", stats.prompt_s), ("other", stats.other_s))
        for name, seconds in parts:
            share = seconds / stats.total_s if stats.total_s > 0 else 0.0
            filled, empty = bar(share, 10)
            self.text.append(f" {name:<7}")
            self.text.append(filled, self.style[name])
            self.text.append(empty, self.style["bar-empty"])
            self.text.append(f" {seconds:6.2f} s {share:4.0%}\n")
        self.line(" total", f"{stats.total_s:.2f} s")

    def speed(self, stats: TurnStats, info: TurnInfo, baseline_tps: float | None) -> None:
        line = self.line
        self.heading("Speed")
        line("Tokens/s", f"{stats.tokens_per_s:.1f}", f"decode {decode_tokens_per_s(stats):.1f}")
        line("First token", f"{stats.ttft_s:.2f} s")
        if stats.threads:
            line("CPU threads", str(stats.threads), "adapts unless set")
        if not info.live:
            line("Prompt", f"{stats.prompt_tokens} tok",
                 f"{stats.prompt_tokens_per_s:.0f} tok/s" if stats.prompt_s > 0 else "")
        if info.replay is not None:
            line("Speedup", f"{info.replay.speedup:.2f}×", "replayed at K 0")
            self.text.append(f"{info.replay.summary()} ({info.replay_basis})\n",
                             self.style["muted"])
        elif is_target_only(stats):
            line("Speedup", "1.00×", "this turn is the target-only baseline")
        elif baseline_tps:
            ratio = decode_tokens_per_s(stats) / baseline_tps
            line("Speedup", f"{ratio:.2f}×",
                 f"vs target-only {baseline_tps:.1f} tok/s (measured)")
        else:
            self.text.append("Speedup: send a turn at K 0 (ctrl+down) to measure the target "
                             "alone, or replay this reply at K 0 (F8).\n", self.style["muted"])

