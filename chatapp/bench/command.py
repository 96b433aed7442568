"""``bench_command``: what ``specchat bench`` runs (load, warm up, run, report, write the JSON)."""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from chatapp.assembly.loader import load_backend
from chatapp.bench.baseline import BASELINE, Launcher
from chatapp.bench.busy import BusyProcesses
from chatapp.bench.policy_memory import PolicyMemory
from chatapp.bench.report import Row, print_report, summarise
from chatapp.bench.runner import Bench, BenchBackends, progress_printer
from chatapp.bench.specs import BenchPrompt, RunSpec, default_specs, load_prompts
from chatapp.settings.config import Config

DEFAULT_BENCH_TOKENS = 128
BUSY_MAX_S = 3 * 3600  # --busy processes end by themselves after this, whatever happens


def bench_max_tokens(config: Config) -> int:
    """``DEFAULT_BENCH_TOKENS`` new tokens per run unless the config asks for another count."""
    return DEFAULT_BENCH_TOKENS if config.max_tokens == Config().max_tokens else config.max_tokens


def bench_command(config: Config, json_path: Path | None, *,
                  backends: BenchBackends | None = None,
                  prompts: Sequence[BenchPrompt] | None = None,
                  specs: Sequence[RunSpec] | None = None,
                  max_tokens: int | None = None,
                  warmup: bool = True,
                  memories: Sequence[PolicyMemory] = (PolicyMemory.FRESH,),
                  repeats: int = 1,
                  busy: int = 0,
                  baseline: Sequence[str] | None = None,
                  out: TextIO | None = None,
                  log: TextIO | None = None) -> int:
    """Run the bench, print the table to ``out`` (stdout), write all rows to ``json_path``.

    Defaults: every prompt of ``chatapp/data/bench_prompts.json``, ``default_specs()``, and
    ``DEFAULT_BENCH_TOKENS`` new tokens unless the config asks for another ``max_tokens``.
    A set of ``specs`` without target-only decoding gets it added: the ratios need it.
    ``repeats`` rounds per prompt; each adaptive configuration runs once per state of
    ``memories`` (``chatapp.bench.policy_memory``).
    ``busy`` CPU-bound processes run beside the measured runs (warm-up included), for at most
    ``BUSY_MAX_S`` seconds. ``baseline``: another installation's Python, whose target-only run
    of each prompt is compared (``chatapp.bench.baseline``).
    """
    out = out or sys.stdout
    log = log or sys.stderr
    prompts = load_prompts() if prompts is None else prompts
    specs = default_specs() if specs is None else specs
    if RunSpec(None) not in specs:
        specs = [RunSpec(None), *specs]
    if max_tokens is None:
        max_tokens = bench_max_tokens(config)

    launcher = Launcher() if baseline else None  # before any model is loaded here
    owned = backends is None
    try:
        if backends is None:
            backends = BenchBackends(load_backend(config.target, "target", config,
                                                  progress_printer(log)))
        bench = Bench(config, backends, specs, max_tokens, log, repeats, busy, baseline,
                      launcher, memories)
        with BusyProcesses(busy, BUSY_MAX_S):
            if warmup:
                bench.warm_up(prompts[0])
            rows = bench.run(prompts)
    finally:
        if launcher is not None:
            launcher.close()
        if owned and backends is not None:
            for backend in (backends.target, backends.draft, backends.assistant):
                if backend is not None:
                    backend.close()
    names = bench.names + ([BASELINE] if baseline else [])
    _report(bench, prompts, rows, names, BASELINE if baseline else None, json_path, out)
    return 0


def _report(bench: Bench, prompts: Sequence[BenchPrompt], rows: list[Row], names: list[str],
            baseline: str | None, json_path: Path | None, out: TextIO) -> None:
    """Print the table of ``rows`` (configurations ``names``, against ``baseline`` if any) with
    the peak memory, and write everything to ``json_path`` (if any)."""
    summaries = summarise(rows, names, baseline)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_report(out, bench.describe(len(prompts)), summaries, rows, peak_rss_mib)
    if json_path is not None:
        data = {"meta": {**bench.meta(), "prompts": [dataclasses.asdict(p) for p in prompts],
                         "peak_rss_mib": peak_rss_mib},
                "summary": [s.to_json() for s in summaries],
                "rows": [row.to_json() for row in rows],
                "runs": [dataclasses.asdict(record) for record in bench.records]}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"Wrote {json_path}", file=out)

