"""`specchat bench --repeats N`: rounds interleave the configurations, the ratios are paired within
a round and reported as medians with their range; `--policy-memory` says and sets what each auto
configuration's policy starts from."""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from chatapp.backends.fake import FakeBackend
from chatapp.bench import BenchBackends, BenchPrompt, PolicyMemory, RunSpec, bench_command
from chatapp.bench.policy_memory import memory_state, spec_config
from chatapp.bench.rounds import Spread, paired_ratios
from chatapp.bench.runner import Bench
from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import MODEL_SOURCE
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.measurements import memory_path, remember
from chatapp.settings.config import Config
from tests.test_draft_policy import cheap, simulate, steep

PROMPTS = [BenchPrompt("one", "code-edit", "the spec token is the draft token"),
           BenchPrompt("two", "code-edit", "You and the user"),
           BenchPrompt("three", "prose", "the target and the draft")]


def run_bench(tmp_path: Path, specs, prompts=PROMPTS, log: io.StringIO | None = None,
              **kwargs) -> tuple[str, dict]:
    out = io.StringIO()
    backends = BenchBackends(FakeBackend(), FakeBackend(noise=1.0))
    path = tmp_path / "bench.json"
    assert bench_command(Config(seed=0), path, backends=backends, prompts=prompts, specs=specs,
                         max_tokens=30, out=out, log=log or io.StringIO(), warmup=False,
                         **kwargs) == 0
    return out.getvalue(), json.loads(path.read_text())


def test_each_round_runs_every_configuration_once_in_a_rotating_order(tmp_path: Path) -> None:
    specs = [RunSpec(None), RunSpec("model", 2), RunSpec("ngram")]
    _, data = run_bench(tmp_path, specs, repeats=3)
    runs = data["runs"]
    assert [r["prompt"] for r in runs] == [p.id for p in PROMPTS for _ in range(3 * 3)]
    orders = defaultdict(list)
    for run in runs:
        orders[(run["prompt"], run["round"])].append(run["config"])
        assert run["position"] == len(orders[(run["prompt"], run["round"])]) - 1
    names = ["target", "K=2", "ngram auto"]
    for (prompt, round_), order in orders.items():
        assert sorted(order) == sorted(names), (prompt, round_)  # each once a round
    for prompt in PROMPTS:
        firsts = [orders[(prompt.id, r)][0] for r in range(3)]
        assert sorted(firsts) == sorted(names)  # over the rounds, each one runs first once
        for r in range(1, 3):  # a rotation of the round before
            before, now = orders[(prompt.id, r - 1)], orders[(prompt.id, r)]
            assert now == before[1:] + before[:1]
    for row in data["rows"]:
        assert len(row["round_ratios"]) == 3 and len(row["repeat_tokens_per_s"]) == 3
    assert data["meta"]["rounds"] == 3


# Generation speeds per (prompt number, configuration), round by round. Prompt 1's K=2 row: paired
# ratios 1.1, 1.1, 3.0, median 1.1; their mean would be 1.73 and the ratio of the medians
# (22 / 10) 2.2. Prompt 2: 0.5, 2.0, 1.0.
SPEEDS = {(1, "target"): [10.0, 20.0, 10.0], (1, "K=2"): [11.0, 22.0, 30.0],
          (2, "target"): [10.0, 10.0, 10.0], (2, "K=2"): [5.0, 20.0, 10.0]}


def scripted_speeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of the bench decodes at the speed ``SPEEDS`` gives its prompt, configuration
    and round (its real run, with the times rewritten)."""
    real = Bench._generate
    count: Counter = Counter()

    def generate(self, spec, engine, policy, prompt, settings, seed=0):
        run = real(self, spec, engine, policy, prompt, settings, seed)
        key = (seed, spec.name)
        speed = SPEEDS[key][count[key]]
        count[key] += 1
        run.stats = dataclasses.replace(run.stats, prompt_s=0.0,
                                        total_s=run.stats.tokens / speed)
        return run

    monkeypatch.setattr(Bench, "_generate", generate)


def test_ratios_are_medians_of_ratios_paired_within_a_round(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    scripted_speeds(monkeypatch)
    table, data = run_bench(tmp_path, [RunSpec(None), RunSpec("model", 2)], PROMPTS[:2],
                            repeats=3)
    rows = {(r["prompt"], r["config"]): r for r in data["rows"]}
    one = rows[("one", "K=2")]
    assert one["round_ratios"] == pytest.approx([1.1, 1.1, 3.0])
    assert one["ratio"] == pytest.approx(1.1)  # not the mean, 1.73, nor 22 / 10
    assert (one["ratio_low"], one["ratio_high"]) == pytest.approx((1.1, 3.0))
    assert rows[("two", "K=2")]["ratio"] == pytest.approx(1.0)
    # per round the geometric mean over the category's prompts, then the median over rounds
    per_round = [(1.1 * 0.5) ** 0.5, (1.1 * 2.0) ** 0.5, (3.0 * 1.0) ** 0.5]
    summary = next(s for s in data["summary"] if s["config"] == "K=2")
    assert summary["ratio_median"] == pytest.approx(per_round[1])
    assert (summary["ratio_low"], summary["ratio_high"]) == pytest.approx(
        (per_round[0], per_round[2]))
    assert summary["category_ratio"]["code-edit"] == pytest.approx(
        {"median": per_round[1], "low": per_round[0], "high": per_round[2]})
    by_run = {(r["prompt"], r["config"], r["round"]): r["ratio"] for r in data["runs"]}
    assert by_run[("one", "K=2", 2)] == pytest.approx(3.0)
    assert f"{per_round[1]:.2f} ({per_round[0]:.2f}-{per_round[2]:.2f})" in table


def test_paired_ratios_and_their_spread() -> None:
    ratios = paired_ratios([11.0, 22.0, 30.0], [10.0, 20.0, 10.0])
    assert ratios == pytest.approx([1.1, 1.1, 3.0])
    assert Spread.of(ratios) == pytest.approx(Spread(1.1, 1.1, 3.0))
    assert Spread.of([0.9, 1.1]).median == pytest.approx(1.0)
    assert Spread(1.02, 0.97, 1.05).cell(True) == "1.02 (0.97-1.05)"
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def learnt_never_to_draft() -> None:
    """The memory the app keeps for the draft model with auto on a machine where drafting never
    pays (steep verification, nothing accepted): it learnt to decode plainly."""
    policy = AutoDraftLength()
    simulate(policy, 300, steep, 0.028, lambda _: 0.0, np.random.default_rng(0))
    assert policy.current_k() == 0
    config = spec_config(Config(seed=0), RunSpec("model"))
    remember(policy, memory_path(config.measured_setup()))


def test_fresh_and_learnt_policies_start_from_different_states(tmp_path: Path) -> None:
    learnt_never_to_draft()
    log = io.StringIO()
    table, data = run_bench(tmp_path, [RunSpec("model")], PROMPTS[:1], log=log, repeats=2,
                            memories=(PolicyMemory.FRESH, PolicyMemory.LEARNT))
    assert "no learnt policy memory" not in log.getvalue()
    states = data["meta"]["memory_states"]
    assert set(states) == {"auto [fresh]", "auto [learnt]"}
    assert states["auto [fresh]"]["learnt"] is None
    assert MODEL_SOURCE in states["auto [learnt]"]["learnt"]["arms"]
    assert states["auto [learnt]"]["file"].endswith(".json")
    rows = {r["config"]: r for r in data["rows"]}
    assert rows["auto [fresh]"]["memory"] == "fresh"
    assert rows["auto [learnt]"]["memory"].startswith("learnt (sources: model")
    # (which of the two drafts more is the machine's: both start from its calibration, and the
    # fake target's costs are flat, where drafting pays even at the acceptance the memory holds)
    assert "auto [learnt]" in table
    assert "auto [learnt]: learnt (sources: model" in table.splitlines()[0]


def test_every_learnt_run_starts_from_the_same_snapshot() -> None:
    """What one run learns is not the next run's start, nor is a memory written meanwhile."""
    learnt_never_to_draft()
    config = spec_config(Config(seed=0), RunSpec("model"))
    state = memory_state(Config(seed=0), RunSpec("model"), PolicyMemory.LEARNT)
    first = state.new_policy(config)
    start = first.learnt()
    assert start["arms"] and isinstance(first, AutoDraftLength) and first.current_k() == 0
    simulate(first, 100, cheap, 0.0, lambda _: 1.0, np.random.default_rng(1))
    assert first.learnt() != start  # this run learnt
    remember(first, memory_path(config.measured_setup()))  # as the app beside the bench might
    assert state.new_policy(config).learnt() == start
    fresh = memory_state(Config(seed=0), RunSpec("model"), PolicyMemory.FRESH)
    assert fresh.new_policy(config).learnt()["arms"] == {}


def test_learnt_without_a_memory_says_so(tmp_path: Path) -> None:
    log = io.StringIO()
    _, data = run_bench(tmp_path, [RunSpec("ngram")], PROMPTS[:1], log=log,
                        memories=(PolicyMemory.LEARNT,))
    state = data["meta"]["memory_states"]["ngram auto"]
    assert state["learnt"] is None and state["state"] == "learnt: none found (fresh)"
    before_runs = log.getvalue().split("[1/1]")[0]  # said before the first run, not only after
    assert "ngram auto found no learnt policy memory" in before_runs
    assert state["file"] in before_runs and "specchat run" in before_runs


def test_the_json_names_the_cpu(tmp_path: Path) -> None:
    _, data = run_bench(tmp_path, [RunSpec(None)], PROMPTS[:1])
    assert isinstance(data["meta"]["cpu_has_amx"], bool) and data["meta"]["cpu_model"]
    assert data["meta"]["policy_memory"] == ["fresh"]


def test_the_json_holds_the_costs_each_adaptive_configuration_started_from(
        tmp_path: Path) -> None:
    """What the policy chose depends on the curve it was calibrated with: the JSON keeps it."""
    _, data = run_bench(tmp_path, [RunSpec(None), RunSpec("ngram")], PROMPTS[:1])
    calibrations = data["meta"]["calibrations"]
    assert set(calibrations) == {"ngram auto"}
    verify = Calibration.from_data(calibrations["ngram auto"]).verify
    assert min(verify) == 1 and all(seconds > 0 for seconds in verify.values())


def test_policy_memory_flag() -> None:
    from chatapp.bench import MEMORY_CHOICES
    from chatapp.cli import build_parser

    args = build_parser().parse_args(["bench", "--policy-memory", "both"])
    assert MEMORY_CHOICES[args.policy_memory] == (PolicyMemory.FRESH, PolicyMemory.LEARNT)
    assert build_parser().parse_args(["bench"]).policy_memory == "fresh"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--policy-memory", "kept"])
