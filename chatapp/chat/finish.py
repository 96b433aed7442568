"""How a reply ended, in words: one text per finish reason a chat stores (the engine's ``stop``,
``length`` and ``cancelled``, and the conversation's ``error``), for every place that shows it
(the exported Markdown, the TUI's reply header and statistics)."""

from __future__ import annotations

FINISH_TEXTS = {"stop": "done", "length": "cut at max tokens", "cancelled": "stopped",
                "error": "failed"}


def finish_text(finish_reason: str | None) -> str:
    """The words for ``finish_reason`` ("" for None, a reply still streaming, or an unknown one)."""
    return FINISH_TEXTS.get(finish_reason or "", "")
