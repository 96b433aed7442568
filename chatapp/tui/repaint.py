"""Showing a widget's new content at the cost of that widget alone: a layout is the whole
screen's (every widget arranged again, and what moved painted again), so it is asked for only
when the content's height changed."""

from __future__ import annotations

from textual.widget import Widget


def repaint(widget: Widget) -> None:
    """Paint ``widget`` again once its content changed, and lay the screen out again only when
    the content now takes another number of lines (or the widget is not laid out yet). For
    widgets whose width does not follow their content (a ``width`` other than ``auto``)."""
    lines = widget.content_size.height
    widget.refresh()
    width = widget.content_size.width
    size = widget.content_size
    if not width or widget.get_content_height(size, size, width) != lines:
        widget.refresh(layout=True)
