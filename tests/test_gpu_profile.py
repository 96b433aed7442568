"""`python -m benchmarks.gpu_profile` on the CPU with the tiny random model: the JSON's shape,
its sanity (positive costs, the requested acceptance, exact greedy verification), the speedup
formula against hand-computed values, and the per-category predictions of a bench JSON.

The in-process run uses one thread (a tiny model runs faster on one than on contended cores); the
subprocess run checks the command line end to end at zero acceptance. The synchronisation count,
CUDA-only, is checked on a pretend GPU whose evaluations warn as torch's sync debug mode does.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu_profile
from benchmarks.gpu_profile import (
    SyntheticDrafter,
    build_backend,
    category_acceptance,
    main,
    predicted_speedup,
    syncs_per_step,
)
from chatapp.engine.loop import SpeculativeEngine

MAX_N = 6
ACCEPT = 0.8
TOKENS = 160  # enough tested draft positions for the acceptance estimate to land near ACCEPT
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], str]]:
    """The JSON and the printed table of one in-process run."""
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = io.StringIO()
    try:
        assert main(["--device", "cpu", "--sizes", "tiny", "--context", "24", "--max-n",
                     str(MAX_N), "--k", "4", "--accept", str(ACCEPT), "--tokens", str(TOKENS),
                     "--repeats", "1", "--json", str(path)], out) == 0
    finally:
        torch.set_num_threads(before)
    yield json.loads(path.read_text(encoding="utf-8")), out.getvalue()


def test_the_json_describes_the_run(profiled: tuple[dict[str, Any], str]) -> None:
    report, table = profiled
    meta = report["meta"]
    assert meta["device"] == "CPU" and meta["dtype"] == "float32"
    assert meta["torch"] == torch.__version__ and meta["date"]
    assert meta["command"].startswith("python -m benchmarks.gpu_profile --device cpu")
    assert (meta["max_n"], meta["k"], meta["accept"], meta["tokens"]) == (MAX_N, 4, ACCEPT,
                                                                          TOKENS)
    assert list(report["sizes"]) == ["tiny"] and report["draft"]["size"] == "tiny"
    assert "verify ms by n" in table and "a = 0.8" in table


def test_costs_are_positive_for_every_n(profiled: tuple[dict[str, Any], str]) -> None:
    report, _ = profiled
    tiny = report["sizes"]["tiny"]
    assert list(tiny["verify_s"]) == [str(n) for n in range(1, MAX_N + 1)]
    assert all(seconds > 0 for seconds in tiny["verify_s"].values())
    assert report["draft"]["step_s"] > 0 and tiny["draft_step_s"] == report["draft"]["step_s"]
    assert tiny["parameters"] > 0
    assert tiny["plain"]["tokens_per_s"] > 0 and tiny["speculative"]["tokens_per_s"] > 0
    assert tiny["syncs_per_step"] == {"plain": None, "speculative": None}  # counted on CUDA only


def test_the_synthetic_drafter_gets_the_requested_acceptance(
        profiled: tuple[dict[str, Any], str]) -> None:
    speculative = profiled[0]["sizes"]["tiny"]["speculative"]
    assert abs(speculative["per_token_acceptance"] - ACCEPT) < 0.1
    assert 0 < speculative["acceptance_rate"] < speculative["per_token_acceptance"]
    assert speculative["tokens_per_call"] > 1.5
    assert speculative["target_calls"] < TOKENS


def test_greedy_verification_gives_the_plain_reply(
        profiled: tuple[dict[str, Any], str]) -> None:
    tiny = profiled[0]["sizes"]["tiny"]
    assert tiny["plain"]["tokens"] == tiny["speculative"]["tokens"] == TOKENS
    assert tiny["speculative"]["identical_to_plain"]
    assert tiny["speculative"]["same_prefix"] == TOKENS


def test_the_predictions_follow_the_measured_costs(profiled: tuple[dict[str, Any], str]) -> None:
    tiny = profiled[0]["sizes"]["tiny"]
    verify = {int(n): seconds for n, seconds in tiny["verify_s"].items()}
    table = tiny["predicted_speedup"]
    assert list(table) == ["0.6", "0.7", "0.8", "0.9"]
    assert all(list(by_k) == [str(k) for k in range(1, MAX_N)] for by_k in table.values())
    assert table["0.7"]["3"] == pytest.approx(
        predicted_speedup(0.7, 3, tiny["draft_step_s"], verify))
    assert tiny["predicted_x_plain"] == pytest.approx(table["0.8"]["4"])


def test_predicted_speedup_by_hand() -> None:
    # E = (1 - 0.5^3) / 0.5 = 1.75 tokens per step; a step costs 2 x 1 + 12; plain 10 per token
    assert predicted_speedup(0.5, 2, 1.0, {1: 10.0, 3: 12.0}) == pytest.approx(1.75 * 10 / 14)
    assert predicted_speedup(1.0, 3, 0.0, {1: 10.0, 4: 20.0}) == pytest.approx(2.0)  # E = K + 1
    assert predicted_speedup(0.0, 1, 5.0, {1: 10.0, 2: 10.0}) == pytest.approx(10 / 15)
    # E = 1 + 0.9 + 0.81 + 0.729 = 3.439; a step costs 3 x 2 + 14
    assert predicted_speedup(0.9, 3, 2.0, {1: 10.0, 4: 14.0}) == pytest.approx(34.39 / 20)
    with pytest.raises(ValueError):
        predicted_speedup(1.5, 2, 1.0, {1: 1.0, 3: 1.0})
    with pytest.raises(KeyError):
        predicted_speedup(0.5, 4, 1.0, {1: 1.0, 3: 1.0})


def bench_json() -> dict[str, Any]:
    """A ``specchat bench --json`` output's rows: only the ``auto`` ones count."""
    rows = [("code", "auto", 0.5), ("code", "auto", 0.7), ("chat", "auto", 0.4),
            ("code", "K=4", 0.1), ("chat", "target", 0.0)]
    return {"rows": [{"prompt": f"p{i}", "category": c, "config": config, "acceptance_rate": a}
                     for i, (c, config, a) in enumerate(rows)]}


def test_category_acceptance_is_the_mean_of_the_auto_rows() -> None:
    assert category_acceptance(bench_json()) == pytest.approx({"code": 0.6, "chat": 0.4})
    assert category_acceptance({"rows": []}) == {}


def test_the_command_line_end_to_end(tmp_path: Path) -> None:
    """At zero acceptance every draft token is rejected: one token per target call."""
    bench, out = tmp_path / "bench.json", tmp_path / "out" / "profile.json"
    bench.write_text(json.dumps(bench_json()), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_profile", "--device", "cpu", "--sizes",
         "tiny", "--context", "8", "--max-n", "3", "--tokens", "12", "--k", "2", "--accept",
         "0", "--repeats", "1", "--acceptance-json", str(bench), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    tiny = json.loads(out.read_text(encoding="utf-8"))["sizes"]["tiny"]
    assert tiny["speculative"]["per_token_acceptance"] == 0.0
    assert tiny["speculative"]["tokens_per_call"] == 1.0
    assert tiny["speculative"]["identical_to_plain"]
    categories = tiny["category_speedup"]
    assert categories["code"]["acceptance"] == pytest.approx(0.6)
    assert list(categories["chat"]["speedup_by_k"]) == ["1", "2"]
    assert "code (0.60)" in result.stdout


@pytest.mark.parametrize("arguments", [["--sizes", "3b"], ["--sizes", "tiny,0.5b"],
                                       ["--sizes", "tiny", "--accept", "1.5"],
                                       ["--sizes", "tiny", "--k", "0"]])
def test_bad_arguments_are_refused(arguments: list[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_profile.parse_args(["--device", "cpu", *arguments])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_so() -> None:
    out = io.StringIO()
    assert main(["--sizes", "tiny", "--json", os.devnull], out) == 2
    assert "--device cpu" in out.getvalue()


@pytest.mark.filterwarnings("ignore:called a synchronizing")  # the prompt's, not counted
def test_syncs_are_counted_per_step_on_a_pretend_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every evaluation warns as torch's sync debug mode does for its one device-to-host copy:
    a plain step evaluates once, a step at K = 3 four times (the prompt is not counted)."""
    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    target, draft = (build_backend("tiny", torch.device("cpu"), seed, 64) for seed in (0, 1))
    for backend in (target, draft):
        monkeypatch.setattr(backend, "evaluate", warning(backend.evaluate))
    prompt = list(range(10))
    gpu = torch.device("cuda")
    assert syncs_per_step(gpu, SpeculativeEngine(target), prompt, 0) == 1.0
    drafter = SyntheticDrafter(draft, prompt, [], 0.5, 0)
    assert syncs_per_step(gpu, SpeculativeEngine(target, drafter), prompt, 3) == 4.0
    assert modes == ["warn", "default"] * 2
    assert syncs_per_step(torch.device("cpu"), SpeculativeEngine(target), prompt, 0) is None


def warning(evaluate: Any) -> Any:
    """``evaluate`` that warns first."""

    def evaluate_and_warn(tokens: list[int], n_logits: int) -> Any:
        warnings.warn("called a synchronizing CUDA operation")
        return evaluate(tokens, n_logits)
    return evaluate_and_warn
