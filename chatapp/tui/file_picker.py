"""The file picker (ctrl+f): the folder specchat started in as a tree; Enter on a file picks it."""

from __future__ import annotations

import os
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Label


def shown_path(path: Path, folder: Path) -> str:
    """``path`` as the message names it: relative to ``folder`` when inside it, else as is."""
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return os.fspath(path)


class FilePickerScreen(ModalScreen[str | None]):
    """Returns the picked file's path (relative to ``folder`` when inside it), None on Esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="dialog"):
            yield Label(f"Attach a file from {self.folder}", classes="dialog-title",
                        markup=False)
            yield DirectoryTree(self.folder, id="picker-tree")
            yield Label("↑/↓ move · Enter opens a folder or attaches a file · Esc closes",
                        classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(DirectoryTree).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        self.dismiss(shown_path(event.path, self.folder))

    def action_cancel(self) -> None:
        self.dismiss(None)
