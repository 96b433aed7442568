"""Modal screens: help, settings, the list of saved chats."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Select, Static, TextArea
from textual.widgets.option_list import Option

from chatapp.chat.chats import ChatSummary, SavedChats
from chatapp.chat.events import TokenSource
from chatapp.chat.terminal_text import printable, printable_line
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config, ConfigError, default_config_path
from chatapp.settings.config_file import save_config
from chatapp.settings.options import OPTIONS, OptionError
from chatapp.tui.widgets import TOKEN_MEANINGS, TokenText

HelpSection = tuple[str, Sequence[tuple[str, str]]]


def key_label(keys: str) -> str:
    """'ctrl+up,alt+up' -> 'ctrl+↑ / alt+↑'."""
    names = {"up": "↑", "down": "↓", "left": "←", "right": "→", "escape": "Esc",
             "enter": "Enter", "tab": "Tab", "home": "Home", "end": "End", "delete": "Del"}
    shown = []
    for key in keys.split(","):
        parts = key.strip().split("+")
        last = parts[-1]
        last = names.get(last, last.upper() if last.startswith("f") and last[1:].isdigit()
                         else last)
        shown.append("+".join(parts[:-1] + [last]))
    return " / ".join(shown)


class HelpScreen(ModalScreen[None]):
    """Every key binding, by where it works, and what the token colours mean."""

    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: Sequence[HelpSection]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Label("specchat · keys", classes="dialog-title")
            with VerticalScroll():
                yield Static(self._table(), id="help-keys")
                yield Label("Token colours", classes="dialog-heading")
                pieces: list[tuple[str, TokenSource | None]] = []
                for source in TokenSource:
                    pieces += [(f"{source.value:<10}", source),
                               (f" {TOKEN_MEANINGS[source]}\n", None)]
                yield TokenText(pieces, id="help-legend")
            yield Label("Esc closes this help.", classes="dialog-hint")

    def _table(self) -> Text:
        """Keys and what they do, in two columns (a Rich Text: cheap to render)."""
        width = max(len(keys) for _, rows in self.sections for keys, _ in rows) + 3
        text = Text()
        for index, (title, rows) in enumerate(self.sections):
            if index:
                text.append("\n")
            text.append(title, style="bold underline")
            text.append("\n")
            for keys, description in rows:
                text.append(f"{keys:<{width}}", style="bold")
                text.append(f"{description}\n")
        return text

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


SETTING_FIELDS = (
    ("temperature", "Temperature", "0 = greedy"),
    ("top_p", "Top-p", "(0, 1]; 1 = off"),
    ("top_k", "Top-k", "0 = off"),
    ("seed", "Seed", "empty: random"),
    ("max_tokens", "Max tokens", "longest reply"),
    ("draft_length", "Draft length K", f"{OPTIONS['draft_length'].rule.text} (0 = no draft)"),
    ("target", "Target model", "alias or path; changing it reloads"),
    ("draft", "Draft model", "alias or path; changing it reloads"),
    ("n_ctx", "Context", "tokens; changing it reloads"),
)


class SettingsScreen(ModalScreen[Config | None]):
    """Sampling, draft length, system prompt and models. Returns the new Config (or None).

    "Save as defaults" also writes them to ``config_path`` (None: the default config file)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save"),
                Binding("f8,alt+s", "save_defaults", "Save as defaults")]

    def __init__(self, config: Config, config_path: Path | None = None) -> None:
        super().__init__()
        self.config = config
        self.config_path = config_path

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box", classes="dialog"):
            yield Label("Settings", classes="dialog-title")
            with VerticalScroll():
                with Grid(id="settings-grid"):
                    for name, label, hint in SETTING_FIELDS:
                        value = getattr(self.config, name)
                        yield Label(label)
                        yield Input("" if value is None else str(value), id=f"set-{name}",
                                    placeholder=hint, tooltip=hint)
                    yield Label("Backend")
                    yield self._choice("backend")
                    yield Label("Draft backend")
                    yield self._choice("draft_backend", tooltip="same: the target's backend")
                    yield Label("Drafter")
                    yield self._choice("drafter")
                    yield Label("When full")
                    yield self._choice("overflow", tooltip="a message over the context: leave the "
                                       "oldest turns out of the model's view, or refuse it")
                yield Label("System prompt", classes="dialog-heading")
                yield TextArea(self.config.system_prompt, id="set-system_prompt",
                               soft_wrap=True, tab_behavior="focus")
            yield Label("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save (ctrl+s)", variant="primary", id="settings-save")
                yield Button("Save as defaults (F8)", id="settings-save-defaults",
                             tooltip="Apply, and write to the config file for the next start")
                yield Button("Cancel (Esc)", id="settings-cancel")

    def _choice(self, name: str, tooltip: str | None = None) -> Select[str]:
        """A list of the values setting ``name`` allows, its value selected."""
        return Select([(c, c) for c in OPTIONS[name].choices], value=getattr(self.config, name),
                      allow_blank=False, id=f"set-{name}", tooltip=tooltip)

    def on_mount(self) -> None:
        self.query_one("#set-temperature", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-save":
            self.action_save()
        elif event.button.id == "settings-save-defaults":
            self.action_save_defaults()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        try:
            config = self.read_config()
        except (ConfigError, ValueError) as error:
            self.query_one("#settings-error", Label).update(Text(str(error)))
            return
        self.dismiss(config)

    def action_save_defaults(self) -> None:
        """Apply the settings and write them to the config file; on failure stay open."""
        try:
            config = self.read_config()
            path = save_config(config, self.config_path or default_config_path())
        except (ConfigError, ValueError) as error:
            self.query_one("#settings-error", Label).update(Text(str(error)))
            return
        self.notify(f"Saved to {path}", title="Settings saved", timeout=6, markup=False)
        self.dismiss(config)

    def read_config(self) -> Config:
        """The Config of the form; ``OptionError`` naming the field and its setting for a value
        the setting does not allow (its rules are ``chatapp.settings.options``'), ``ConfigError``
        for settings that do not go together."""
        labels = {name: label for name, label, _ in SETTING_FIELDS}

        def text(name: str) -> str:
            return self.query_one(f"#set-{name}", Input).value.strip()

        def parsed(name: str) -> Any:
            try:
                return OPTIONS[name].parse(text(name))
            except OptionError as error:
                raise OptionError(f"{labels[name]} ({name}) {error}.") from None

        values = dict(
            temperature=parsed("temperature"),
            top_p=parsed("top_p"),
            top_k=parsed("top_k"),
            seed=parsed("seed") if text("seed") else None,
            max_tokens=parsed("max_tokens"),
            draft_length=parsed("draft_length") if text("draft_length") else "0",
            target=text("target") or self.config.target,
            draft=text("draft") or self.config.draft,
            n_ctx=parsed("n_ctx"),
            backend=str(self.query_one("#set-backend", Select).value),
            draft_backend=str(self.query_one("#set-draft_backend", Select).value),
            drafter=str(self.query_one("#set-drafter", Select).value),
            overflow=str(self.query_one("#set-overflow", Select).value),
            system_prompt=self.query_one("#set-system_prompt", TextArea).text,
        )
        return dataclasses.replace(self.config, **values)


class TitleDialog(ModalScreen[str | None]):
    """Asks for a chat's new title: Enter returns it, Esc returns None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old_title = title

    def compose(self) -> ComposeResult:
        with Vertical(id="title-box", classes="dialog"):
            yield Label("Rename the chat", classes="dialog-title")
            yield Input(self.old_title, id="title-input", placeholder="The chat's new title")
            yield Label("Enter renames · Esc keeps the old title", classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChatListScreen(ModalScreen[tuple[str, int] | None]):
    """Saved chats. Returns ("open", id), ("new", 0) or None; renames, deletes and exports in
    place, through the conversation's ``SavedChats``."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export to Markdown"),
    ]

    def __init__(self, chats: SavedChats, current_chat: int | None,
                 export_dir: Path | None = None) -> None:
        super().__init__()
        self.chats = chats
        self.current_chat = current_chat
        self.export_dir = export_dir
        self._armed_delete: int | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box", classes="dialog"):
            yield Label("Chats", classes="dialog-title")
            yield OptionList(id="chat-list")
            yield Label("", id="chats-status")
            yield Label("Enter open · n new · r rename · d delete · e export to Markdown · "
                        "Esc close", classes="dialog-hint")

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(OptionList).focus()

    def refresh_list(self, highlight: int | None = None) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        chats = self.chats.list_chats()
        for chat in chats:
            options.add_option(Option(self._describe(chat), id=str(chat.id)))
        if not chats:
            options.add_option(Option("No saved chats yet. Press n for a new chat.",
                                      disabled=True))
        elif highlight is not None:
            options.highlighted = min(highlight, len(chats) - 1)
        else:
            ids = [c.id for c in chats]
            options.highlighted = ids.index(self.current_chat) if self.current_chat in ids else 0

    def _describe(self, chat: ChatSummary) -> Text:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated_at))
        current = "  (open)" if chat.id == self.current_chat else ""
        title = printable_line(chat.title)  # a history from anywhere: show it safely
        text = Text(title or "(untitled)", style="bold")
        text.append(current)
        count = f"{chat.message_count} message" + ("" if chat.message_count == 1 else "s")
        text.append(f"\n  {count} · {stamp}", style="dim")
        if chat.target:
            text.append(printable(f" · {chat.draft} → {chat.target}"), style="dim")
        return text

    def _highlighted_chat(self) -> int | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        return int(option.id) if option.id else None

    def _say(self, text: str) -> None:
        self.query_one("#chats-status", Label).update(Text(text))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(("open", int(event.option.id)))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_new(self) -> None:
        self.dismiss(("new", 0))

    def action_rename(self) -> None:
        """Ask for a new title for the highlighted chat, then give it that title."""
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        self._armed_delete = None
        try:
            chat = self.chats.get(chat_id)
        except UserFacingError as error:
            self._say(str(error))
            return

        def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                stored = self.chats.rename(chat.id, title)
            except UserFacingError as error:
                self._say(str(error))
                return
            self.refresh_list(highlight=self.query_one(OptionList).highlighted)
            self._say(f"Renamed to {stored}.")

        self.app.push_screen(TitleDialog(chat.title), renamed)

    def action_delete(self) -> None:
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        if self._armed_delete != chat_id:
            self._armed_delete = chat_id
            self._say("Press d again to delete this chat for good.")
            return
        index = self.query_one(OptionList).highlighted
        self._armed_delete = None
        try:
            self.chats.delete(chat_id)
        except UserFacingError as error:
            self._say(str(error))
            return
        self._say("Chat deleted.")
        self.refresh_list(highlight=index)

    def action_export(self) -> None:
        chat_id = self._highlighted_chat()
        if chat_id is None:
            return
        try:
            path = self.chats.export_markdown(chat_id, self.export_dir)
        except UserFacingError as error:
            self._say(str(error))
            return
        self._say(f"Exported to {path}")
        self.notify(f"Exported to {path}", title="Chat exported", timeout=10, markup=False)
