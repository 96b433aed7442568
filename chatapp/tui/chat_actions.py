"""What a user does with the messages: regenerate, replay at K = 0, edit and resend, copy.

``ChatActionsMixin`` is part of ``SpecChatApp``. Each action picks its message (the selected one
in the message list, else the latest that fits), asks the conversation to act, and says what
happened; the conversation refuses with a ``UserFacingError`` the app shows as a notification.
"""

from __future__ import annotations

import re

from textual import work

from chatapp.chat.turns import ChatEntry, ReplayJob
from chatapp.errors import UserFacingError
from chatapp.tui.errors import describe_error
from chatapp.tui.messages import ReplayDone
from chatapp.tui.widgets import MessageView

# A fenced Markdown code block: ``` or ~~~, an optional language, the code, the same fence
# (or the end of the text: a reply stopped or cut at max tokens leaves its last block open).
CODE_BLOCK = re.compile(r"^ *(```|~~~)[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^ *\1[ \t]*$|\Z)",
                        re.MULTILINE | re.DOTALL)


def last_code_block(text: str) -> tuple[str, str] | None:
    """The last fenced code block of ``text`` as (language or "", code), or None if none; a
    block the text ends in before its closing fence counts."""
    blocks = CODE_BLOCK.findall(text)
    if not blocks:
        return None
    _fence, language, code = blocks[-1]
    return language, code.rstrip("\n")


class ChatActionsMixin:
    """Regenerate (F6, shift+F6), replay at K 0 (F8, z), edit (e), copy (c, b)."""

    def action_regenerate(self, new_seed: bool = False) -> None:
        turn = self.start_turn(lambda: self.chat.regenerate(new_seed))
        if turn is not None and new_seed:
            self.notify(f"Regenerating with the new seed {turn.meta['seed']}.", timeout=4)

    def action_replay(self) -> None:
        """Decode the selected (or last) reply again with the target alone, to measure what
        speculation bought on it; the result goes to the reply's statistics."""
        view = self._stats_view()
        if view is None or view.entry is None:
            self.notify("There is no finished reply to replay yet.", severity="warning")
            return
        try:
            job = self.chat.prepare_replay(view.entry)
        except UserFacingError as error:
            self.notify(str(error), severity="warning", markup=False)
            return
        self.notify("Replaying this reply at K 0 (the target alone) to measure its speedup; "
                    "Esc stops.", timeout=5)
        self.update_status()
        self.refresh_bindings()
        self._run_replay(job)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False)
    def _run_replay(self, job: ReplayJob) -> None:
        try:
            self.post_message(ReplayDone(job, self.chat.run_replay(job)))
        except Exception as error:  # shown as a notification, never a traceback
            self.post_message(ReplayDone(job, None, describe_error(error)))

    def on_replay_done(self, message: ReplayDone) -> None:
        self.chat.end_replay(message.job, message.result)
        if not self.is_running:
            return
        if message.error:
            self.notify(message.error, title="The replay failed", severity="error",
                        timeout=10, markup=False)
        elif message.result is None:
            self.notify("Replay stopped.", timeout=3)
        else:
            self.notify(message.result.summary(), title="Replay at K 0", timeout=10)
        self.update_status()
        self.refresh_bindings()
        self._refresh_stats()

    def action_edit_message(self) -> None:
        """Put the selected (or last) user message in the message box; Enter resends it."""
        entry = self._picked_entry("user")
        if entry is None:
            self.notify("There is no message of yours to edit yet.", severity="warning")
            return
        if self.chat.busy:
            self.notify("Wait for the reply to end (Esc stops it), then edit.",
                        severity="warning")
            return
        if self.editing is None:
            self._text_before_edit = self.chat_input.text
        self.editing = entry
        self.chat_input.show_text(entry.content)
        self.chat_input.focus()
        self.notify("Editing your message: Enter resends it and replaces the later turns; "
                    "Esc cancels.", timeout=6)
        self.update_status()
        self.refresh_bindings()

    def _picked_entry(self, role: str) -> ChatEntry | None:
        """The selected message if it has ``role``; for a selected reply the user message
        before it; else the chat's last message with ``role``."""
        entries = self.chat.entries
        selected = self.message_list.selected
        if selected is not None and selected.entry in entries:
            earlier = entries[:entries.index(selected.entry) + 1]
            return next((e for e in reversed(earlier) if e.role == role), None)
        return next((e for e in reversed(entries) if e.role == role), None)

    def _copy_view(self) -> MessageView | None:
        """The selected message, else the last reply."""
        views = self.message_list.views
        if self.message_list.selected in views:
            return self.message_list.selected
        return next((v for v in reversed(views) if v.role == "assistant"), None)

    def action_copy_message(self) -> None:
        view = self._copy_view()
        if view is None or not view.plain:
            self.notify("There is no message to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(view.plain)
        what = "your message" if view.role == "user" else "the reply"
        self.notify(f"Copied {what} ({len(view.plain)} characters) to the clipboard.",
                    timeout=4)

    def action_copy_code(self) -> None:
        view = self._copy_view()
        block = last_code_block(view.plain) if view is not None else None
        if block is None:
            self.notify("That message has no code block.", severity="warning")
            return
        language, code = block
        lines = code.count("\n") + 1
        kind = f"{language} " if language else ""
        self.copy_to_clipboard(code)
        self.notify(f"Copied the {kind}code block ({lines} line{'s' * (lines != 1)}) to the "
                    "clipboard.", timeout=4, markup=False)
