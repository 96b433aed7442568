"""The offline replay of the model-free drafter (benchmarks.drafter_replay)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.drafter_replay import (
    ceiling_speedup,
    conversation_chats,
    costs_from_option,
    main,
    replay,
)
from chatapp.backends.fake import FakeBackend
from chatapp.chat.message import ChatMessage
from chatapp.drafters.lookup import NgramDrafter
from chatapp.engine.calibration import Calibration


def test_replay_counts_the_target_calls_of_greedy_verification(capsys) -> None:
    quoted = list(range(10, 40))
    prompt = [1, 2] + quoted + [3]
    assert replay(NgramDrafter(64), prompt, quoted, k=0) == [1] * len(quoted)  # no drafting
    steps = replay(NgramDrafter(64), prompt, quoted, k=8)
    assert sum(steps) == len(quoted)
    assert len(steps) < len(quoted) / 3  # the reply copies the prompt: long accepted runs
    capsys.readouterr()
    assert replay(NgramDrafter(64), prompt, quoted, k=8, piece=str) == steps  # with a trace
    assert len(capsys.readouterr().out.splitlines()) == len(steps)  # a line per step


def test_the_oracle_cuts_each_draft_where_it_pays_best() -> None:
    quoted = list(range(10, 40))
    prompt = [1, 2] + quoted + [3]
    # 4 tokens cost as much as 1, 5 or more cost far more: once the lookup matches (after the
    # first, plain, step), every step emits 4, the last what is left
    costs = [1.0, 1.0, 1.0, 1.0] + [10.0] * 5
    steps = replay(NgramDrafter(64), prompt, quoted, k=8, costs=costs)
    assert steps == [1] + [4] * 7 + [1]
    assert ceiling_speedup(steps, costs) == pytest.approx(30 / 9)
    assert replay(NgramDrafter(64), prompt, quoted, k=8)[1] == 9  # without: 8 drafts and 1


def test_a_conversation_is_replayed_turn_by_turn_with_the_whole_chat_before_each() -> None:
    target = FakeBackend()
    data = {"conversation": {"turns": ["write it", "change it"]},
            "replies": ["the code", "the new code"]}
    system = [ChatMessage("system", "be brief")]
    chats = conversation_chats(target, system, data)
    assert list(chats) == ["turn 1", "turn 2"]
    assert chats["turn 1"] == (target.chat_prompt(system + [ChatMessage("user", "write it")]),
                               target.tokenize("the code"))
    second_prompt, second_reply = chats["turn 2"]
    assert second_prompt == target.chat_prompt(system + [
        ChatMessage("user", "write it"), ChatMessage("assistant", "the code"),
        ChatMessage("user", "change it")])
    assert second_reply == target.tokenize("the new code")


def test_history_is_refused_for_a_conversation_before_a_model_loads(tmp_path, capsys) -> None:
    path = tmp_path / "conv.json"
    path.write_text(json.dumps({"conversation": {"turns": ["a"]}, "replies": ["b"]}))
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), "--history"])
    assert exit_info.value.code == 2
    assert "--history" in capsys.readouterr().err


def test_the_auto_policy_replays_on_the_same_proposals_and_costs() -> None:
    """``--auto``: the calibrated policy chooses each step's draft as the engine would; on a
    reply that copies the prompt it beats plain decoding, and never the oracle."""
    from benchmarks.drafter_replay import replay_auto
    from chatapp.engine.calibration import Calibration
    from chatapp.policy.auto import AutoDraftLength

    quoted = list(range(10, 70))
    prompt = [1, 2] + quoted + [3]
    costs = [1.0 + 0.1 * n for n in range(17)]  # verifying more tokens costs a little more
    policy = AutoDraftLength()
    policy.calibrate(Calibration(dict(enumerate(costs, 1))))
    speedup = replay_auto(NgramDrafter(64), prompt, quoted, policy, costs)
    ceiling = ceiling_speedup(replay(NgramDrafter(64), prompt, quoted, k=16, costs=costs), costs)
    assert 1.0 < speedup <= ceiling


def test_the_costs_can_be_the_ones_the_bench_run_was_calibrated_with(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    calibrated = Calibration({1: 0.025, 2: 0.04, 3: 0.05}, 0.01).as_data()
    data = {"meta": {"calibrations": {"ngram+model auto": calibrated}}}
    assert costs_from_option("calibrated", data, parser) == [0.025, 0.04, 0.05]
    assert costs_from_option("25,40", data, parser) == [0.025, 0.04]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"meta": {"calibrations": {}}, "rows": []}))
    with pytest.raises(SystemExit):
        main([str(path), "--costs", "calibrated"])
    assert "one calibration" in capsys.readouterr().err
