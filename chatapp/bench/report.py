"""The bench's results: one ``Run`` per prompt, configuration and round, the ``Row`` of a prompt
and configuration (its ratios against the target-only run of the same round, their median and
range over the rounds: ``chatapp.bench.rounds``), the per-configuration ``Summary`` and the
printed table."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from chatapp.bench.rounds import (
    Spread,
    geometric_mean,
    median_round,
    paired_ratios,
    per_round_geomeans,
)
from chatapp.bench.specs import TARGET, BenchPrompt
from chatapp.engine.kv import common_prefix_length
from chatapp.engine.stats import SourceTally, TurnStats, decode_tokens_per_s


@dataclass
class Run:
    """One decoding of one prompt: the tokens, the engine's statistics, why it ended, how many
    steps drafted how many tokens, the policy's label, the seconds inside the model calls and
    what each source that drafted did."""

    output: list[int]
    stats: TurnStats
    finish_reason: str
    drafted_per_step: Counter
    policy: str
    model_s: float = 0.0
    by_source: dict[str, SourceTally] = field(default_factory=dict)

    @property
    def speed(self) -> float:
        """Generation tokens per second (the prompt left out)."""
        return decode_tokens_per_s(self.stats)


@dataclass
class RunRecord:
    """One run as the JSON keeps it: which prompt, configuration and round, its place in the
    round's order, its speed and its ratio to the target-only run of the same round."""

    prompt: str
    config: str
    round: int
    position: int
    tokens: int
    tokens_per_s: float
    ratio: float
    drafted: int
    accepted: int
    target_calls: int
    policy: str
    finish_reason: str

    @classmethod
    def of(cls, prompt: str, config: str, round_: int, position: int, run: Run,
           reference: Run) -> "RunRecord":
        stats = run.stats
        return cls(prompt, config, round_, position, stats.tokens, run.speed,
                   paired_ratios([run.speed], [reference.speed])[0], stats.drafted,
                   stats.accepted, stats.target_calls, run.policy, run.finish_reason)


@dataclass
class Row:
    """One prompt through one configuration over the rounds: ``ratio`` is the median of the
    ratios paired within each round (``round_ratios``), ``ratio_low``/``ratio_high`` their range,
    ``tokens_per_s`` the median speed; the other figures are those of the run whose ratio is
    closest to the median. ``memory``: what an adaptive policy started each run from."""

    prompt: str
    category: str
    config: str
    tokens: int
    tokens_per_s: float
    e2e_tokens_per_s: float
    ratio: float
    acceptance_rate: float
    mean_accepted_length: float
    drafted: int
    accepted: int
    target_calls: int
    draft_s: float
    verify_s: float
    prompt_s: float
    other_s: float
    total_s: float
    model_s: float  # inside the models' evaluate/truncate calls
    engine_share: float  # share of the generation time spent outside them
    ttft_s: float
    same_as_target: int
    identical: bool
    finish_reason: str
    policy: str
    drafted_per_step: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, dict[str, float]] = field(default_factory=dict)  # SourceTally's fields
    repeat_tokens_per_s: list[float] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    round_ratios: list[float] = field(default_factory=list)
    ratio_low: float = 0.0
    ratio_high: float = 0.0
    memory: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Summary:
    """One configuration over all prompts: sums, and ratios as medians over the rounds of each
    round's geometric mean over the prompts (all of them, and each category's), with their
    lowest and highest (``chatapp.bench.rounds``)."""

    config: str
    prompts: int
    rounds: int
    memory: str
    tokens_per_s: float  # all tokens / all generation time
    ratio_median: float
    ratio_low: float
    ratio_high: float
    ratio_min: float  # the worst prompt's median ratio
    ratio_min_prompt: str
    acceptance_rate: float
    mean_accepted_length: float
    draft_s: float
    verify_s: float
    prompt_s: float
    other_s: float
    total_s: float
    engine_share: float  # outside the model calls, as a share of the generation time
    same_as_target: float  # mean tokens before the first difference
    identical: int
    category_ratio: dict[str, Spread]
    baseline_ratio: float | None = None  # against the baseline's rows (``--baseline``), if any
    baseline_category_ratio: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_row(prompt: BenchPrompt, name: str, runs: Sequence[Run], references: Sequence[Run],
             memory: str = "") -> Row:
    """The row of configuration ``name`` on ``prompt`` from its ``runs``, one per round, each
    measured against the target-only run of the same round in ``references``."""
    ratios = paired_ratios([run.speed for run in runs], [run.speed for run in references])
    middle = median_round(ratios)
    run, reference = runs[middle], references[middle]
    stats = run.stats
    same = common_prefix_length(run.output, reference.output)
    return Row(
        prompt=prompt.id, category=prompt.category, config=name, tokens=stats.tokens,
        tokens_per_s=statistics.median(run.speed for run in runs),
        e2e_tokens_per_s=stats.tokens_per_s, ratio=statistics.median(ratios),
        acceptance_rate=stats.acceptance_rate, mean_accepted_length=stats.mean_accepted_length,
        drafted=stats.drafted, accepted=stats.accepted, target_calls=stats.target_calls,
        draft_s=stats.draft_s, verify_s=stats.verify_s, prompt_s=stats.prompt_s,
        other_s=stats.other_s, total_s=stats.total_s, model_s=run.model_s,
        engine_share=_engine_share(stats.total_s, stats.prompt_s, run.model_s),
        ttft_s=stats.ttft_s,
        same_as_target=same, identical=run.output == reference.output,
        finish_reason=run.finish_reason, policy=run.policy,
        drafted_per_step={str(k): v for k, v in sorted(run.drafted_per_step.items())},
        by_source={source: dataclasses.asdict(tally)
                   for source, tally in sorted(run.by_source.items())},
        repeat_tokens_per_s=[run.speed for run in runs], output=list(run.output),
        round_ratios=ratios, ratio_low=min(ratios), ratio_high=max(ratios), memory=memory)


def compared_to(row: Row, reference: Row) -> Row:
    """``row`` (of another process: the baseline's, one run) with its ratio and sameness
    measured against ``reference``, this bench's target-only row of the same prompt (its median
    speed over the rounds)."""
    speed = reference.tokens_per_s
    same = common_prefix_length(row.output, reference.output)
    ratio = row.tokens_per_s / speed if speed > 0 else 0.0
    return dataclasses.replace(row, ratio=ratio, same_as_target=same,
                               identical=row.output == reference.output, round_ratios=[ratio],
                               ratio_low=ratio, ratio_high=ratio)


def _engine_share(total_s: float, prompt_s: float, model_s: float) -> float:
    """The engine's own time (everything outside the model calls) over the generation time."""
    generation_s = total_s - prompt_s
    return max(0.0, total_s - model_s) / generation_s if generation_s > 0 and model_s > 0 else 0.0


def summarise(rows: Sequence[Row], configs: Sequence[str],
              baseline: str | None = None) -> list[Summary]:
    """One summary per configuration of ``configs`` that has rows, in that order; with the
    configuration name ``baseline``, also each one's speed against its rows, prompt by prompt."""
    summaries = []
    base_speed = {row.prompt: row.tokens_per_s for row in rows if row.config == baseline}
    for name in configs:
        mine = [row for row in rows if row.config == name]
        if not mine:
            continue
        worst = min(mine, key=lambda row: row.ratio)
        tokens = sum(row.tokens for row in mine)
        generation_s = sum(row.total_s - row.prompt_s for row in mine)
        drafted = sum(row.drafted for row in mine)
        calls = sum(row.target_calls for row in mine)
        categories: dict[str, list[list[float]]] = {}
        for row in mine:
            categories.setdefault(row.category, []).append(row.round_ratios)
        overall = Spread.of(per_round_geomeans([row.round_ratios for row in mine]))
        summaries.append(Summary(
            config=name, prompts=len(mine), rounds=len(mine[0].round_ratios),
            memory=mine[0].memory,
            tokens_per_s=tokens / generation_s if generation_s > 0 else 0.0,
            ratio_median=overall.median, ratio_low=overall.low, ratio_high=overall.high,
            ratio_min=worst.ratio, ratio_min_prompt=worst.prompt,
            acceptance_rate=sum(row.accepted for row in mine) / drafted if drafted else 0.0,
            mean_accepted_length=tokens / calls if calls else 0.0,
            draft_s=sum(row.draft_s for row in mine), verify_s=sum(row.verify_s for row in mine),
            prompt_s=sum(row.prompt_s for row in mine), other_s=sum(row.other_s for row in mine),
            total_s=sum(row.total_s for row in mine),
            engine_share=_engine_share(sum(row.total_s for row in mine),
                                       sum(row.prompt_s for row in mine),
                                       sum(row.model_s for row in mine)),
            same_as_target=sum(row.same_as_target for row in mine) / len(mine),
            identical=sum(row.identical for row in mine),
            category_ratio={c: Spread.of(per_round_geomeans(r)) for c, r in categories.items()},
            **_against_baseline(mine, base_speed)))
    return summaries


def _against_baseline(rows: Sequence[Row], base_speed: dict[str, float]) -> dict[str, Any]:
    """``Summary``'s baseline fields for a configuration's ``rows`` (empty without a baseline)."""
    by_category: dict[str, list[float]] = {}
    for row in rows:
        if base_speed.get(row.prompt, 0.0) > 0:
            by_category.setdefault(row.category, []).append(row.tokens_per_s
                                                            / base_speed[row.prompt])
    if not by_category:
        return {}
    return {"baseline_ratio": geometric_mean([r for rs in by_category.values() for r in rs]),
            "baseline_category_ratio": {c: geometric_mean(r) for c, r in by_category.items()}}


def _print_baseline_ratios(out: TextIO, summaries: Sequence[Summary],
                           categories: Sequence[str]) -> None:
    """Each configuration's speed against the baseline's, by category (if there is one)."""
    if not any(s.baseline_ratio for s in summaries):
        return
    print("", file=out)
    print(f"{'x baseline':<18} {'all':>10} " + " ".join(f"{c:>10}" for c in categories), file=out)
    for s in summaries:
        cells = _by_category(s.baseline_category_ratio, categories)
        print(f"{s.config:<18} {s.baseline_ratio or 0.0:>10.2f} {cells}", file=out)


def _by_category(ratios: Mapping[str, float], categories: Sequence[str]) -> str:
    """One row's ratios by category, each right-aligned under its category's name."""
    return " ".join(f"{ratios.get(c, 0.0):>{max(10, len(c))}.2f}" for c in categories)


def _print_table(out: TextIO, title: str, columns: Sequence[str],
                 lines: Mapping[str, Sequence[str]]) -> None:
    """A table of text cells: one line per key of ``lines``, each cell right-aligned under its
    column's name, every column as wide as its widest cell or name (at least 10)."""
    width = max(len(title), *(len(name) for name in lines))
    widths = [max(10, len(column), *(len(cells[i]) for cells in lines.values()))
              for i, column in enumerate(columns)]
    print(f"{title:<{width}} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths)),
          file=out)
    for name, cells in lines.items():
        print(f"{name:<{width}} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)),
              file=out)


def print_report(out: TextIO, title: str, summaries: Sequence[Summary], rows: Sequence[Row],
                 peak_rss_mib: float) -> None:
    """The table: ``title``, the summaries, the ratios by category and by prompt (with their
    range over the rounds, when there are several), a legend and the peak memory; every column
    as wide as its longest name."""
    print(title, file=out)
    if not summaries:
        print("No complete run.", file=out)
        return
    _print_summaries(out, summaries, rows)
    categories = list(dict.fromkeys(row.category for row in rows))
    print("", file=out)
    spread = any(s.rounds > 1 for s in summaries)
    _print_table(out, "x target, by category", categories, {
        s.config: [s.category_ratio.get(c, Spread.of([])).cell(spread) for c in categories]
        for s in summaries})
    _print_baseline_ratios(out, summaries, categories)
    print("", file=out)
    _print_by_prompt(out, summaries, rows)
    print("", file=out)
    print("Speed: tokens / (turn time - prompt time); time split as shares of the whole turn; "
          "engine: the engine's own work (everything outside the models' evaluate/truncate "
          "calls) as a share of the generation time; same as target: tokens equal to the "
          "target-only output before the first difference "
          "(mean over prompts; n/m all: outputs identical to it).", file=out)
    if spread:
        print("x target: each round's speed over the target-only speed of the same round and "
              "prompt, geometric mean over the prompts; the median over the rounds, with the "
              "lowest and highest in brackets.", file=out)
    print(f"Peak RSS: {peak_rss_mib:.0f} MiB", file=out)


def _print_summaries(out: TextIO, summaries: Sequence[Summary], rows: Sequence[Row]) -> None:
    """One line per configuration: its speed, ratios, acceptance and where the time went."""
    reference_tokens = sum(row.tokens for row in rows if row.config == TARGET) / max(
        1, sum(1 for row in rows if row.config == TARGET))
    worsts = [f"{s.ratio_min:.2f} ({s.ratio_min_prompt})" for s in summaries]
    wide = max(24, *(len(worst) for worst in worsts))
    spread = any(s.rounds > 1 for s in summaries)
    ratios = [Spread(s.ratio_median, s.ratio_low, s.ratio_high).cell(spread) for s in summaries]
    named = max(18, *(len(s.config) for s in summaries))
    across = max(8, *(len(ratio) for ratio in ratios))
    header = (f"{'configuration':<{named}} {'tok/s':>6} {'x target':>{across}} "
              f"{'min x (prompt)':>{wide}} "
              f"{'accept':>6} {'tok/call':>8} {'draft':>6} {'verify':>6} {'prompt':>6} "
              f"{'other':>6} {'engine':>6} {'same as target':>16}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for s, worst, ratio in zip(summaries, worsts, ratios):
        total = s.total_s or 1.0
        accept = f"{s.acceptance_rate:.0%}" if s.acceptance_rate or s.config != TARGET else "-"
        same = f"{s.same_as_target:.0f} of {reference_tokens:.0f}, {s.identical}/{s.prompts} all"
        engine = f"{s.engine_share:.1%}" if s.engine_share else "-"
        print(f"{s.config:<{named}} {s.tokens_per_s:6.1f} {ratio:>{across}} {worst:>{wide}} "
              f"{accept:>6} {s.mean_accepted_length:8.2f} {s.draft_s / total:6.0%} "
              f"{s.verify_s / total:6.0%} {s.prompt_s / total:6.0%} {s.other_s / total:6.0%} "
              f"{engine:>6} {same:>16}", file=out)


def _print_by_prompt(out: TextIO, summaries: Sequence[Summary], rows: Sequence[Row]) -> None:
    """Each prompt's ratio to its target-only run, one column per configuration (the median over
    the rounds, with its range when there are several)."""
    prompts = list(dict.fromkeys(row.prompt for row in rows))
    names = [s.config for s in summaries]
    spread = any(s.rounds > 1 for s in summaries)
    by_key = {(row.prompt, row.config): row for row in rows}
    lines = {}
    for prompt in prompts:
        cells = [by_key[(prompt, n)] if (prompt, n) in by_key else None for n in names]
        lines[prompt] = [Spread(r.ratio, r.ratio_low, r.ratio_high).cell(spread) if r else ""
                         for r in cells]
    _print_table(out, "x target, by prompt", names, lines)
