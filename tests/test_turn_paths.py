"""One event stream, one way to apply it: ``specchat run`` (``Conversation.run``) and the chat
app (a worker streams, the app applies the events) finish the same turn from the same model."""

from __future__ import annotations

import json
import signal

import pytest

import chatapp.assembly.loader
from chatapp.chat.conversation import Conversation
from chatapp.chat.turns import ChatEntry, Turn
from chatapp.cli import run_command
from chatapp.settings.config import Config
from tests.conftest import ready, reply_done, send, tui_fake_factory

# Sampling, so that both paths must also draw the same random numbers in the same order.
CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.9, max_tokens=60)
TEXT = "What is speculative decoding?"
COUNTS = ("tokens", "prompt_tokens", "drafted", "accepted", "target_calls",
          "per_position_accepted")


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Turn, ChatEntry]]:
    """Every turn a conversation finishes, with the entry it made; ``specchat run`` loads the
    fake models of the app's tests."""
    done: list[tuple[Turn, ChatEntry]] = []
    finish = Conversation.finish

    def recorded(self: Conversation, turn: Turn) -> ChatEntry:
        entry = finish(self, turn)
        done.append((turn, entry))
        return entry

    monkeypatch.setattr(Conversation, "finish", recorded)
    factory = tui_fake_factory(max_tokens=CONFIG.max_tokens)
    monkeypatch.setattr(chatapp.assembly.loader, "build_session",
                        lambda config, progress, with_draft=True: factory(config, progress))
    handler = signal.getsignal(signal.SIGINT)
    yield done
    signal.signal(signal.SIGINT, handler)  # run_command's Ctrl-C handler goes with the test


def counts(turn_or_entry: Turn | ChatEntry) -> tuple:
    stats = turn_or_entry.stats() if isinstance(turn_or_entry, Turn) else turn_or_entry.stats
    return tuple(getattr(stats, name) for name in COUNTS)


async def test_specchat_run_finishes_the_turn_the_app_finishes(finished, capsys, tui_make_app):
    assert run_command(CONFIG, TEXT, as_json=False) == 0
    printed = capsys.readouterr().out
    [(run_turn, run_entry)] = finished
    assert run_entry.content and printed == run_entry.content + "\n"
    assert run_turn.text == run_entry.content and run_entry.finish_reason == "length"

    app = tui_make_app(tui_fake_factory(max_tokens=CONFIG.max_tokens), config=CONFIG)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, TEXT)
        await reply_done(pilot)
    app_turn, app_entry = finished[1]
    assert app_entry.content == run_entry.content and app_turn.pieces == run_turn.pieces
    assert [(s.k, s.drafted, s.accepted) for s in app_turn.steps] == [
        (s.k, s.drafted, s.accepted) for s in run_turn.steps]
    assert counts(app_turn) == counts(run_turn) == counts(app_entry) == counts(run_entry)
    assert run_turn.stats().drafted > run_turn.stats().accepted > 0
    assert run_entry.meta["k"] == app_entry.meta["k"] == {"mode": "fixed", "start": 3, "ks": [3]}


def test_specchat_run_json_steps_carry_the_running_statistics(finished, capsys) -> None:
    assert run_command(CONFIG, TEXT, as_json=True) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [(turn, entry)] = finished
    assert "".join(line["text"] for line in lines if line["type"] == "token") == entry.content
    steps = [line for line in lines if line["type"] == "step"]
    done = lines[-1]
    assert done["type"] == "done" and set(done) == {"type", "finish_reason", "stats",
                                                    "context_tokens", "n_ctx"}
    assert done["n_ctx"] == 4096  # the fake target's window
    assert done["context_tokens"] == done["stats"]["prompt_tokens"] + done["stats"]["tokens"]
    assert done["stats"]["prompt_tokens"] > 0 and done["stats"]["tokens"] == len(turn.pieces)
    assert len(steps) == done["stats"]["target_calls"] == len(turn.steps)
    assert all(step["k"] == 3 and not step["adaptive"] for step in steps)
    tokens = [step["stats"]["tokens"] for step in steps]
    assert tokens == sorted(tokens) and tokens[-1] == done["stats"]["tokens"]
    assert sum(step["drafted"] for step in steps) == steps[-1]["stats"]["drafted"]
    for name in COUNTS:
        assert steps[-1]["stats"][name] == done["stats"][name]
