"""The app's keys: its bindings, the help screen's sections and the command palette's commands.

One table per place a key is shown; the help screen's app keys are made from ``BINDINGS``, so
a binding and its help cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textual.app import SystemCommand
from textual.binding import Binding

from chatapp.tui.screens import HelpSection, key_label

BINDINGS = [
    Binding("f1", "help", "Help"),
    Binding("escape", "stop", "Stop reply"),
    Binding("ctrl+up,alt+up", "draft_length(1)", "K+1", key_display="^↑"),
    Binding("ctrl+down,alt+down", "draft_length(-1)", "K-1", key_display="^↓"),
    Binding("f2,ctrl+g", "toggle_stats", "Stats"),
    Binding("f3,ctrl+t", "toggle_highlight", "Colours"),
    Binding("f4,ctrl+s", "settings", "Settings"),
    Binding("ctrl+n", "new_chat", "New"),
    Binding("ctrl+f", "attach_file", "Attach", show=False),
    Binding("ctrl+o,f5", "chats", "Chats"),
    Binding("f6", "regenerate", "Regen", show=False),
    Binding("shift+f6", "regenerate(True)", "Regen new seed", show=False),
    Binding("f8", "replay", "Replay K0", show=False),
    Binding("f9", "export", "Export", show=False),
    Binding("ctrl+r", "reload", "Reload models", show=False),
    Binding("ctrl+q", "quit", "Quit", priority=True),
]

# Longer descriptions for the help screen than the footer has room for.
HELP_TEXT = {
    "help": "Help: this list of keys",
    "stop": "Stop the reply (kept as stopped) or the replay; cancel an edit",
    "draft_length(1)": "Draft length K + 1 (works mid-reply, from the next step)",
    "draft_length(-1)": "Draft length K - 1 (K 0: the target alone, the speedup baseline)",
    "toggle_stats": "Stats panel: the live, selected or latest turn",
    "toggle_highlight": "Token colours (a tint under each token) on / off",
    "settings": "Settings: sampling, K, seed, system prompt, models",
    "new_chat": "New chat",
    "attach_file": "Attach a file: pick it in a tree, its @path goes in the message",
    "chats": "Saved chats: open, search, rename, delete, export",
    "regenerate": "Regenerate the last reply (same settings)",
    "regenerate(True)": "Regenerate the last reply with a new random seed",
    "replay": "Replay the selected or last reply at K 0: its real speedup (F2)",
    "export": "Export this chat to Markdown",
    "reload": "Reload the models",
    "quit": "Quit",
}


def help_sections() -> list[HelpSection]:
    """The help screen: every key, grouped by where it works."""
    app_keys = [(key_label(b.key), HELP_TEXT.get(b.action, b.description)) for b in BINDINGS]
    app_keys.append(("ctrl+p", "Command palette (settings, K, chats, copy, edit…)"))
    return [
        ("Anywhere in the chat", app_keys),
        ("Message box", [
            ("Enter", "Send (waits for the models while they load)"),
            ("ctrl+j / shift+enter", "New line"),
            ("ctrl+z / ctrl+y", "Undo / redo"),
            ("ctrl+a / ctrl+e", "Start / end of line"),
            ("ctrl+x / ctrl+c / ctrl+v", "Cut / copy / paste"),
            ("@path", "Attach that file (relative to the start folder, ~ expanded) when sent"),
            ("Tab after @…", "Complete the path (lists the matches when they differ)"),
            ("Tab", "Go to the messages"),
        ]),
        ("Messages (after Tab, or click one)", [
            ("↑ / ↓ (k / j)", "Select a message: the stats panel shows its turn"),
            ("Home / End", "First / last message"),
            ("c", "Copy the message to the clipboard"),
            ("b", "Copy its last code block"),
            ("e", "Edit your message, Enter resends it (later turns replaced)"),
            ("", "  the chat as it was stays in the chats as \"<title> (before edit)\""),
            ("z", "Replay the reply at K 0 (as F8)"),
            ("Enter / Esc", "Back to the message box"),
            ("?", "This help"),
        ]),
        ("Chat list (ctrl+o)", [
            ("Enter", "Open the chat (a search result: at that message)"),
            ("/", "Search every chat by text: the matching messages, words highlighted"),
            ("n", "New chat"),
            ("r", "Rename the chat"),
            ("d, d", "Delete the chat"),
            ("e", "Export it to Markdown"),
            ("Esc", "Clear the search, else close"),
        ]),
    ]


def system_commands(app: Any) -> Iterable[SystemCommand]:
    """The app's commands in the command palette (ctrl+p)."""
    commands: list[tuple[str, str, Callable[[], Any]]] = [
        ("New chat", "Start an empty chat (ctrl+n)", app.action_new_chat),
        ("Chats", "Open, search, rename, delete or export saved chats (ctrl+o)",
         app.action_chats),
        ("Settings", "Sampling, draft length, system prompt, models (F4)", app.action_settings),
        ("Attach file", "Pick a file; its @path goes into the message (ctrl+f)",
         app.action_attach_file),
        ("Regenerate reply", "The last reply again, same settings (F6)", app.action_regenerate),
        ("Regenerate with a new seed", "The last reply again from a fresh random seed (shift+F6)",
         lambda: app.action_regenerate(True)),
        ("Replay at K = 0", "Decode the selected or last reply with the target alone: its real "
         "speedup (F8)", app.action_replay),
        ("Edit message", "Edit your selected or last message and resend (e on a message)",
         app.action_edit_message),
        ("Copy message", "The selected or last reply to the clipboard (c on a message)",
         app.message_list.action_copy_message),
        ("Copy code block", "Its last code block to the clipboard (b on a message)",
         app.message_list.action_copy_code),
        ("Export chat", "Write this chat as Markdown (F9)", app.action_export),
        ("Toggle stats panel", "Speculation statistics (F2)", app.action_toggle_stats),
        ("Toggle token colours", "Tints under the tokens on / off (F3)",
         app.action_toggle_highlight),
        ("Reload models", "Load the pair again (ctrl+r)", app.action_reload),
        ("Keys", "Show every key (F1)", app.action_help),
        ("Draft length auto", "Let the adaptive policy choose K per step",
         app.set_auto_draft_length),
    ]
    for title, help_text, callback in commands:
        yield SystemCommand(title, help_text, callback)
    for preset in app.config.presets:
        yield SystemCommand(f"Preset: {preset.name}", f"From the next reply: {preset.summary()}",
                            lambda name=preset.name: app.use_preset(name))
    for k in (0, 1, 2, 3, 4, 5, 6, 8):
        note = " (target alone: measures the speedup baseline)" if k == 0 else ""
        yield SystemCommand(f"Draft length K = {k}", f"Draft {k} tokens per step{note}",
                            lambda k=k: app.set_draft_length(k))
