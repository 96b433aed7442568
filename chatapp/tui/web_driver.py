"""The app's driver under `specchat web`: Textual's web driver (the app talks to the server over
stdin and stdout), except that the app quits, as on Ctrl+Q, when its stdin ends: the server is
gone (killed, crashed), and the app would otherwise run on, models loaded, for nobody."""

from __future__ import annotations

from textual import messages
from textual.drivers.web_driver import WebDriver


class ServedDriver(WebDriver):
    def run_input_thread(self) -> None:
        super().run_input_thread()
        if not self.exit_event.is_set():  # the input ended without the app stopping
            self._app.post_message(messages.ExitApp())
