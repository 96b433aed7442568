"""The API's measurement tools on fake backends: python -m benchmarks.serve_overhead (`specchat
run` against fresh `specchat serve` processes) and python -m benchmarks.serve_agent (a scripted
agent session against two servers)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from benchmarks import serve_agent, serve_fim, serve_overhead
from chatapp.bench.specs import load_prompts, select_prompts
from tests.serve_launcher import REPO, ServeProcess


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


def test_the_prediction_measurement_sends_each_edit_three_ways(fake_commands) -> None:
    """python -m benchmarks.serve_prediction on fake servers, fresh ones every round: the
    original code as the prediction, the same reply with and without it, a target-only server
    started with -k 0, a row per prompt with the medians over the rounds."""
    from benchmarks import serve_prediction

    assert serve_prediction.original_code("Fix:\n\n```python\nx = 1\n```\nthanks") == "x = 1\n"
    assert serve_prediction.original_code("Fix this:\n\nx = 1") == "x = 1"
    out = io.StringIO()
    prompts = select_prompts(load_prompts(), "edit-rename,edit-fstring")
    results = serve_prediction.measure(prompts, 24, 2, ["--max-tokens", "24"], out,
                                       fake_commands.serve)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| edit-")]
    assert len(results) == len(rows) == 2
    for result in results:
        assert len(result.without) == len(result.with_prediction) == len(result.target_only) == 2
        assert result.equal_rounds == 2 and result.ratio > 0 and result.speedup(result.without) > 0
        assert all(reply.tokens_per_target_call == 1.0 for reply in result.target_only)
        assert all(reply.accepted_prediction + reply.rejected_prediction > 0
                   for reply in result.with_prediction)
    assert all(row.endswith("| 2 of 2 |") for row in rows), out.getvalue()
    assert "median of 2 rounds" in out.getvalue()
    assert "Speed-up over target-only with the prediction" in out.getvalue()


def test_a_wrong_prediction_is_another_prompts_code() -> None:
    from benchmarks import serve_prediction

    prompts = select_prompts(load_prompts(), "edit-rename,edit-fstring,edit-logging")
    right = serve_prediction.predictions(prompts)
    assert right == [serve_prediction.original_code(prompt.text) for prompt in prompts]
    assert serve_prediction.predictions(prompts, wrong=True) == [right[1], right[2], right[0]]
    assert serve_prediction.main(["--wrong", "--prompts", "edit-rename"]) == 2


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


@pytest.fixture(scope="module")
def agent_servers(tmp_path_factory: pytest.TempPathFactory):
    """The default drafter's fake server and a target-only one (-k 0), each with a context
    window for the whole session (the fake's tokens are bytes)."""
    first = ServeProcess(tmp_path_factory.mktemp("default"), ["--n-ctx", "65536"])
    second = ServeProcess(tmp_path_factory.mktemp("plain"), ["--n-ctx", "65536", "-k", "0"])
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


def test_the_agent_session_regrows_the_conversation_on_both_servers(
        agent_servers, monkeypatch: pytest.MonkeyPatch) -> None:
    """python -m benchmarks.serve_agent: each request re-sends the conversation so far (the
    default server's replies as assistant messages), the same to both servers, which reply the
    same; the later requests draft from the suffix index of what the default server served, and
    the summary covers the last requests."""
    default, plain = agent_servers
    sent: list[tuple[str, list[dict[str, str]]]] = []
    serve_once = serve_agent.serve_once

    def spy(url: str, messages, *rest):  # noqa: ANN001, ANN202
        sent.append((url, [dict(message) for message in messages]))
        return serve_once(url, messages, *rest)

    monkeypatch.setattr(serve_agent, "serve_once", spy)
    out = io.StringIO()
    turns = serve_agent.load_session()
    assert len(turns) == 20
    steps = serve_agent.run_session(default.base_url, plain.base_url, turns[:6], 40, out)
    assert [step.turn for step in steps] == [1, 2, 3, 4, 5, 6]
    assert all(step.same_reply and step.tokens == 40 for step in steps), out.getvalue()
    in_turns = [default.base_url, plain.base_url, plain.base_url, default.base_url]
    assert [url for url, _ in sent] == in_turns * 3  # the order swaps every turn
    final = sent[-1][1]
    assert [message["role"] for message in final] == ["user", "assistant"] * 5 + ["user"]
    for number in range(6):
        assert sent[2 * number][1] == sent[2 * number + 1][1] == final[:2 * number + 1]
    assert final[4]["content"] == serve_agent.user_message(
        turns[2], [final[1]["content"]])  # turn 3 quotes the code of reply 1
    assert sum(step.accepted_by_source.get("suffix", 0) for step in steps[1:]) > 0
    assert steps[0].accepted_by_source.get("suffix", 0) == 0  # nothing served yet
    result = serve_agent.summary(steps, 3)
    assert result["requests"] == 3 and result["same_replies"]
    assert result["geometric_mean_ratio"] > 0 and result["total_ratio"] > 0
    rows = [line for line in out.getvalue().splitlines() if line[2:3].isdigit()]
    assert len(rows) == 6 and all(row.endswith("| yes |") for row in rows)


def test_the_agent_session_quotes_earlier_code_as_an_agent_would() -> None:
    reply = "Here:\n```python\nold = 1\n```\nand then\n```python\ndef f():\n    return 2"
    assert serve_agent.last_code(reply) == "def f():\n    return 2\n"  # cut short: still code
    assert serve_agent.last_code("no code at all") == "no code at all\n"
    turn = serve_agent.Turn("The file:\n```python\n{code}```\nFix it.", code_from=1)
    assert serve_agent.user_message(turn, [reply, "later"]) == (
        "The file:\n```python\ndef f():\n    return 2\n```\nFix it.")
    turns = serve_agent.load_session()
    assert all(("{code}" in turn.user) == (turn.code_from is not None) for turn in turns)


def test_the_agent_tool_explains_a_bad_session(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "session.json"
    bad.write_text(json.dumps({"turns": [{"user": "a {code}", "code_from": 1}]}))
    assert serve_agent.main(["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1",
                             "--session", str(bad)]) == 2
    assert "code_from must be the number of an earlier turn" in capsys.readouterr().err
    bad.write_text("{}")
    assert serve_agent.main(["u", "v", "--session", str(bad)]) == 2
    assert "is not an agent session" in capsys.readouterr().err
    assert serve_agent.main(["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1",
                             "--turns", "1"]) == 1
    assert "did not answer" in capsys.readouterr().err


def test_the_fim_benchmark_times_cold_same_and_typed_requests(tmp_path) -> None:
    """python -m benchmarks.serve_fim on a fake server with FIM tokens: three requests a round,
    the warm ones reading only what differs from the cache."""
    server = ServeProcess(tmp_path, ["--fake-fim"])
    out = io.StringIO()
    try:
        assert serve_fim.main([server.base_url, "--rounds", "2", "--functions", "8",
                               "--json", str(tmp_path / "fim.json")], out) == 0
    finally:
        server.stop()
    data = json.loads((tmp_path / "fim.json").read_text())
    assert [(r["round"], r["kind"]) for r in data["rows"]] == [
        (n, kind) for n in (1, 2) for kind in serve_fim.KINDS]
    assert set(data["medians"]) == set(serve_fim.KINDS)
    assert "same: median prompt" in out.getvalue()
    prefix, suffix = serve_fim.module_source(8)
    assert prefix.endswith('."""\n    ') and suffix.startswith("kept = ")


def test_the_structured_measurement_sends_each_schema_to_both_servers(
        fake_commands, monkeypatch: pytest.MonkeyPatch) -> None:
    """python -m benchmarks.serve_structured on fake servers: every case to the drafting server
    and to one started with -k 0, a row per case. (The fakes' vocabulary spells no brace or
    quote: the cases here are JSON booleans.)"""
    from benchmarks import serve_structured

    boolean = serve_structured._schema("yes", {"type": "boolean"})
    monkeypatch.setattr(serve_structured, "CASES", [("is-it", "the user asks", boolean),
                                                    ("is-it-not", "the user asks", boolean)])
    out = io.StringIO()
    results = serve_structured.measure(12, 2, ["--max-tokens", "12"], out, fake_commands.serve)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| is-it")]
    assert len(results) == len(rows) == 2
    for result in results:
        assert len(result.drafting) == len(result.target_only) == 2
        assert result.target_only[0].tokens_per_target_call == 1.0 and result.speedup > 0
        assert result.drafting[0].text in ("true", "false") and result.drafting[0].parses
    assert all(row.endswith("| yes | yes |") for row in rows), out.getvalue()
    assert "Speed-up over target-only" in out.getvalue()
