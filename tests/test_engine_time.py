"""F8 compares like with like: the reply's decode rate and its replay's at K = 0 are both the
engine's own, without the time their consumer held the stream (the app showing the reply).
Timed by a fake clock that both the engine and ``EngineClock`` read."""

from __future__ import annotations

import types

import pytest

import chatapp.chat.engine_time
import chatapp.engine.loop
from chatapp.chat.conversation import Conversation
from chatapp.chat.engine_time import ENGINE_BASIS, SHOWN_BASIS
from chatapp.chat.events import decode_tokens_per_s
from chatapp.settings.config import Config
from tests.conftest import TuiFakeClock, tui_fake_factory

CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> TuiFakeClock:
    clock = TuiFakeClock()
    for module in (chatapp.engine.loop, chatapp.chat.engine_time):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


def reply_and_replay(clock: TuiFakeClock, hold_s: float):
    """A reply whose consumer holds every event ``hold_s`` seconds (a front end rendering it),
    then its replay at K = 0: the reply's entry and the replay's figures."""
    chat = Conversation(CONFIG)
    chat.attach(tui_fake_factory(max_tokens=40)(CONFIG, lambda *_: None))

    def render(_event: object) -> None:
        clock.now += hold_s

    entry = chat.run(chat.begin("hello"), render)
    job = chat.prepare_replay(entry)
    result = chat.run_replay(job)
    chat.end_replay(job, result)
    chat.close()
    return entry, result


def test_the_replay_speedup_leaves_out_the_time_the_reply_was_being_shown(clock):
    quick, quick_replay = reply_and_replay(clock, 0.0)
    slow, slow_replay = reply_and_replay(clock, 1.0)
    # As the engine's clock ran, the slowly shown reply decoded far slower ...
    assert decode_tokens_per_s(slow.stats) < decode_tokens_per_s(quick.stats) / 10
    # ... but in the engine it took what the other took, and its speedup is the same.
    assert slow.engine_decode_tps == pytest.approx(quick.engine_decode_tps)
    assert slow_replay.speculative_tps == pytest.approx(quick_replay.speculative_tps)
    assert slow_replay.plain_tps == pytest.approx(quick_replay.plain_tps)
    assert slow_replay.speedup == pytest.approx(quick_replay.speedup)
    assert slow.replay_basis == ENGINE_BASIS


def test_a_reply_saved_before_it_was_measured_in_the_engine_says_so(clock):
    entry, _ = reply_and_replay(clock, 0.0)
    del entry.meta["engine_decode_tps"]
    assert entry.engine_decode_tps is None and entry.replay_basis == SHOWN_BASIS
    chat = Conversation(CONFIG)
    chat.attach(tui_fake_factory(max_tokens=40)(CONFIG, lambda *_: None))
    chat.entries = [*chat.entries, entry]
    assert chat.prepare_replay(entry).speculative_tps == decode_tokens_per_s(entry.stats)
    chat.close()
