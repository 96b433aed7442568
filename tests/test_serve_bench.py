"""The API's measurement tools on fake backends: python -m chatapp.bench.serve_overhead (`specchat
run` against fresh `specchat serve` processes) and python -m chatapp.bench.serve_agent (a scripted
agent session against two servers)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from chatapp.bench import serve_overhead
from chatapp.bench.specs import load_prompts, select_prompts
from tests.serve_launcher import REPO


@pytest.fixture
def fake_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> serve_overhead.Commands:
    """`specchat run` and `specchat serve` on the fakes, with their files under ``tmp_path``."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name))
    return serve_overhead.Commands(run=(sys.executable, "-m", "tests.run_launcher"),
                                   serve=(sys.executable, "-m", "tests.serve_launcher"))


def test_the_overhead_measurement_pairs_run_with_a_fresh_server(fake_commands) -> None:
    """Each prompt through both paths, repeats times: equal greedy replies, the engine's and
    the client's figures on every row, and the summary of them all."""
    out = io.StringIO()
    prompts = select_prompts(load_prompts(), "2")
    result = serve_overhead.measure(prompts, 40, 2, ["-k", "3"], out, fake_commands)
    assert result["settings"] == ["--temperature", "0", "--seed", "0", "--max-tokens", "40",
                                  "-k", "3"]
    pairs = result["pairs"]
    assert [(p["prompt"], p["repeat"]) for p in pairs] == [
        (prompts[0].id, 0), (prompts[1].id, 0), (prompts[0].id, 1), (prompts[1].id, 1)]
    for pair in pairs:
        assert pair["same_reply"] and pair["tokens"] > 0, out.getvalue()
        assert pair["run_tokens_per_s"] > 0 and pair["serve_tokens_per_s"] > 0
        assert pair["client_ttft_s"] > 0 and pair["serve_ttft_s"] > 0 and pair["run_ttft_s"] > 0
    summary = result["summary"]
    assert summary["pairs"] == 4 and summary["same_replies"]
    assert summary["serve_ratio"] > 0 and summary["client_minus_run_ttft_s"] > -1
    rows = [line for line in out.getvalue().splitlines() if line.startswith(f"| {prompts[0].id}")]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows)
    assert "Geometric means over 4 pairs" in out.getvalue()


def test_the_overhead_summary_states_the_targets() -> None:
    """0.97x of run's decode speed and 50 ms of its time to first token, from the pairs."""
    def pair(serve_tps: float, client_ttft: float) -> serve_overhead.Pair:
        return serve_overhead.Pair("p", 0, 10, 100.0, serve_tps, serve_tps, 0.2, 0.2,
                                   client_ttft, True)

    met = serve_overhead.summary([pair(98.0, 0.24), pair(97.0, 0.22)])
    assert met["decode_target_met"] and met["ttft_target_met"]
    assert met["client_minus_run_ttft_s"] == pytest.approx(0.03)
    assert met["client_minus_run_ttft_max_s"] == pytest.approx(0.04)
    slow = serve_overhead.summary([pair(90.0, 0.24), pair(97.0, 0.30)])
    assert not slow["decode_target_met"] and not slow["ttft_target_met"]


def test_the_overhead_tool_explains_bad_arguments(capsys) -> None:
    assert serve_overhead.main(["--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err
    assert serve_overhead.main(["--prompts", "no-such-prompt"]) == 2
    assert "no bench prompt" in capsys.readouterr().err
