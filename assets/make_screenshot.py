"""Make assets/screenshot.svg again: the app on the default pair answers a code edit, and F2 shows
the turn's statistics. Run from the repository root with the models installed:

    python assets/make_screenshot.py

The chat goes to a temporary history, never the user's.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from chatapp.settings.config import Config
from chatapp.tui.app import SpecChatApp

PROMPT = ("Add type hints to this function:\n\n```python\ndef scale(values, factor):\n"
          "    result = []\n    for value in values:\n        result.append(value * factor)\n"
          "    return result\n```")
OUT = Path(__file__).resolve().parent / "screenshot.svg"


async def wait_until(condition, timeout: float) -> None:
    """Poll ``condition`` every 0.2 s until it holds; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.2)


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        app = SpecChatApp(Config(seed=0, max_tokens=160),
                          history_path=Path(folder) / "history.sqlite3")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(lambda: app.chat.session is not None, 300)
            app.query_one("#input").text = PROMPT
            await pilot.press("enter")
            await wait_until(lambda: app.chat.turn is not None, 30)
            await wait_until(lambda: app.chat.turn is None and not app.chat.busy, 300)
            await pilot.press("f2")
            await pilot.pause(1.0)
            app.save_screenshot(str(OUT.name), str(OUT.parent))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
