"""The offline replay of the model-free drafter (chatapp.drafter_replay)."""

from __future__ import annotations

from chatapp.drafter_replay import replay
from chatapp.ngram import NgramDrafter


def test_replay_counts_the_target_calls_of_greedy_verification(capsys) -> None:
    quoted = list(range(10, 40))
    prompt = [1, 2] + quoted + [3]
    assert replay(NgramDrafter(64), prompt, quoted, k=0) == len(quoted)  # no drafting
    calls = replay(NgramDrafter(64), prompt, quoted, k=8)
    assert calls < len(quoted) / 3  # the reply copies the prompt: long accepted runs
    capsys.readouterr()
    assert replay(NgramDrafter(64), prompt, quoted, k=8, piece=str) == calls  # with a trace
    assert len(capsys.readouterr().out.splitlines()) == calls  # a line per step
