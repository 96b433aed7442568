"""The offline replay of the model-free drafter (chatapp.drafter_replay)."""

from __future__ import annotations

import pytest

from chatapp.drafter_replay import ceiling_speedup, replay
from chatapp.ngram import NgramDrafter


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
