"""SVG snapshots of the chat app (pytest-textual-snapshot). Deterministic: fake backends, seed 0,
greedy sampling, and a fake clock for the engine's timings (the app shows the engine's figures).

Update after an intended change of the look: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from tests.conftest import ready, reply_done, send, tui_fake_factory

SIZE = (120, 40)


def chat_app(tui_make_app):
    return tui_make_app(tui_fake_factory(max_tokens=120))


async def after_a_reply(pilot) -> None:
    pilot.app.chat_input.cursor_blink = False
    await ready(pilot)
    await send(pilot, "What is speculative decoding?")
    await reply_done(pilot)


def test_main_screen_after_a_reply(snap_compare, tui_make_app, tui_engine_clock):
    assert snap_compare(chat_app(tui_make_app), terminal_size=SIZE, run_before=after_a_reply)


def test_stats_panel(snap_compare, tui_make_app, tui_engine_clock):
    assert snap_compare(chat_app(tui_make_app), terminal_size=SIZE, run_before=after_a_reply,
                        press=["f2"])


def test_help_screen(snap_compare, tui_make_app, tui_engine_clock):
    async def loaded(pilot) -> None:
        pilot.app.chat_input.cursor_blink = False
        await ready(pilot)

    assert snap_compare(chat_app(tui_make_app), terminal_size=SIZE, run_before=loaded,
                        press=["f1"])
