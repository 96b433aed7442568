"""`specchat web` on fake backends, for tests that drive it over HTTP and in a browser.

    python -m tests.web_launcher serve STARTS_PATH HISTORY_PATH [WEB OPTIONS...]
        `specchat web WEB OPTIONS` (cli.main), with its app process replaced by the next one
    python -m tests.web_launcher app STARTS_PATH HISTORY_PATH
        the chat app on fake backends: appends its pid to STARTS_PATH, then runs (under the web
        driver when `specchat web` starts it)

Run from the repository root.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path


def serve(starts: str, history: str, options: Sequence[str]) -> int:
    import chatapp.web
    from chatapp.cli import main

    def fake_app(model_options: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "tests.web_launcher", "app", starts, history]

    chatapp.web.app_command = fake_app
    return main(["web", *options])


def app(starts: str, history: str) -> int:
    from chatapp.settings.config import Config
    from chatapp.tui.app import SpecChatApp
    from tests.conftest import tui_fake_factory

    with open(starts, "a") as file:
        file.write(f"{os.getpid()}\n")
    history_path = Path(history)
    config = Config(draft="fake-draft", target="fake-target", draft_length="3", drafter="model",
                    seed=0, temperature=0.0)
    chat = SpecChatApp(config,
                       session_factory=tui_fake_factory(max_tokens=60, delay_s=0.01),
                       history_path=history_path, export_dir=history_path.parent / "exports")
    chat.run()
    return chat.return_code or 0


if __name__ == "__main__":
    role, starts_path, history_path, *rest = sys.argv[1:]
    sys.exit(serve(starts_path, history_path, rest) if role == "serve"
             else app(starts_path, history_path))
