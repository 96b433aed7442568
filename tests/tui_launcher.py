"""Start the chat app on slow fake backends, for tests that run it in a real terminal (a pty).

    python -m tests.tui_launcher HISTORY_PATH [STACKS_PATH]

(With STACKS_PATH, ``kill -USR1`` writes the stack of every thread there.)

The target never ends its turn and sleeps a little per forward, so a reply streams until it is
stopped. Run from the repository root.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from pathlib import Path

from chatapp.settings.config import Config
from chatapp.tui.app import SpecChatApp
from tests.conftest import tui_fake_factory


def main() -> int:
    history = Path(sys.argv[1])
    if len(sys.argv) > 2:  # what a test shows when the app does not exit
        stacks = open(sys.argv[2], "w")  # noqa: SIM115 (open until the process ends)
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    app = SpecChatApp(Config(draft_length="3", drafter="model", seed=0, temperature=0.0),
                      session_factory=tui_fake_factory(max_tokens=100_000, delay_s=0.02,
                                                       endless=True),
                      history_path=history, export_dir=history.parent / "exports")
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
