"""Text that is safe to show on a terminal, for every front end and for chat titles.

Messages hold exactly what was typed or generated; what goes on the screen must never be
something the terminal acts on (an escape sequence that recolours, clears or retitles it, a bell,
a NUL). C0 controls other than tab and the line breaks, DEL and the C1 controls are shown as
visible symbols instead, one for one (so that positions in the text and on the screen agree).
Line and paragraph separators, which terminals do not agree on, are shown as symbols too.
"""

from __future__ import annotations

_SHOWN = str.maketrans({
    **{code: 0x2400 + code for code in range(0x20) if code not in (0x09, 0x0A, 0x0D)},  # ␀ ␇ ␛
    0x7F: 0x2421,  # ␡
    **{code: 0xFFFD for code in range(0x80, 0xA0)},  # C1 controls (0x9B is an 8-bit CSI)
    0x2028: 0x21B5,  # line separator: ↵
    0x2029: 0x00B6,  # paragraph separator: ¶
})


def visible(text: str) -> str:
    """``text`` with every control shown as a visible symbol, one for one (line breaks kept)."""
    return text.translate(_SHOWN)


class Printable:
    """Turns text into text that is safe to show on a terminal, piece by piece: controls become
    visible symbols, CR LF and a lone CR become a line break (as in the message box). A CR at the
    end of one piece and an LF at the start of the next are one line break, as if the text had
    come at once."""

    def __init__(self) -> None:
        self.after_cr = False

    def __call__(self, text: str) -> str:
        if self.after_cr and text.startswith("\n"):
            text = text[1:]
        self.after_cr = text.endswith("\r")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return visible(text)


def printable(text: str) -> str:
    """``text`` as it may be shown on a terminal (see ``Printable``)."""
    return Printable()(text)


def printable_line(text: str) -> str:
    """``printable(text)`` on one line, runs of whitespace as one space (titles, list entries)."""
    return " ".join(printable(text).split())
