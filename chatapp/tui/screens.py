"""Modal screens: help and settings (the chats screen is ``chats_screen``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from chatapp.chat.events import TokenSource
from chatapp.settings.config import Config, ConfigError, default_config_path
from chatapp.settings.config_file import save_config
from chatapp.settings.options import OPTIONS, OptionError
from chatapp.settings.presets import find_preset
from chatapp.tui.token_text import TOKEN_MEANINGS, TokenText

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
    ("target", "Target model", "alias, path or a name F5 lists; changing it reloads"),
    ("draft", "Draft model", "alias, path, a name F5 lists or auto; changing it reloads"),
    ("n_ctx", "Context", "tokens; changing it reloads"),
)


class SettingsScreen(ModalScreen[Config | None]):
    """Sampling, draft length, system prompt and models. Returns the new Config (or None).

    "Find models" (F5) lists the models on this machine with the drafts that fit each
    (``chatapp.assembly.models.found_text``), read in a thread: the first reading of a large
    file's header takes seconds.

    Choosing a preset fills the fields it sets (the others keep their values); the settings
    returned carry its name. "Save as defaults" also writes them to ``config_path`` (None: the
    default config file)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save"),
                Binding("f8,alt+s", "save_defaults", "Save as defaults"),
                Binding("f5", "find_models", "Find models")]

    def __init__(self, config: Config, config_path: Path | None = None) -> None:
        super().__init__()
        self.config = config
        self.config_path = config_path
        self._preset = config.preset  # the preset chosen last in the form
        self.saved: Config | None = None  # the settings written by "Save as defaults"

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box", classes="dialog"):
            yield Label("Settings", classes="dialog-title")
            with VerticalScroll():
                with Grid(id="settings-grid"):
                    yield Label("Preset")
                    yield self._presets()
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
                yield Label("Models on this machine", classes="dialog-heading")
                yield Button("Find models (F5)", id="settings-find-models",
                             tooltip="Ollama's and LM Studio's models, the Hugging Face cache, "
                             "model_dirs: each with the drafts that fit it")
                yield Static("", id="settings-models")
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

    def _presets(self) -> Select[str]:
        """The presets to choose from, the one in force selected ("none": no preset)."""
        presets = self.config.presets
        choices = [("none", "")] + [(p.name, p.name) for p in presets]
        if self.config.preset and all(p.name != self.config.preset for p in presets):
            choices.append((f"{self.config.preset} (no longer in the config)", self.config.preset))
        return Select(choices, value=self.config.preset, allow_blank=False, id="set-preset",
                      tooltip="Fills the fields a preset sets: sampling, K, drafter, system prompt")

    def on_select_changed(self, event: Select.Changed) -> None:
        """A preset chosen: its values go into the fields."""
        if event.select.id != "set-preset" or event.value == self._preset:
            return
        self._preset = str(event.value)
        preset = find_preset(self.config.presets, self._preset)
        for name, value in preset.values if preset is not None else ():
            if name == "system_prompt":
                self.query_one("#set-system_prompt", TextArea).text = value
            elif name == "drafter":
                self.query_one("#set-drafter", Select).value = value
            else:
                self.query_one(f"#set-{name}", Input).value = str(value)

    def on_mount(self) -> None:
        self.query_one("#set-temperature", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-save":
            self.action_save()
        elif event.button.id == "settings-save-defaults":
            self.action_save_defaults()
        elif event.button.id == "settings-find-models":
            self.action_find_models()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_find_models(self) -> None:
        """List the models found on this machine, read in a thread."""
        shown = self.query_one("#settings-models", Static)
        shown.update(Text("Looking for models…"))

        def find() -> None:
            from chatapp.assembly.models import found_text

            text = found_text(self.config)
            self.app.call_from_thread(shown.update, Text(text))

        self.run_worker(find, thread=True, exclusive=True, group="find-models")

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
        self.saved = config
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
            preset=str(self.query_one("#set-preset", Select).value),
        )
        return dataclasses.replace(self.config, **values)
