"""`specchat bench`: speculative decoding against plain target decoding, on one machine.

Every configuration decodes the prompts of ``chatapp/data/bench_prompts.json`` through the app's own
engine (``SpeculativeEngine.generate``) with the app's own loader pieces (``load_backend``,
``make_drafter``, ``make_policy``, ``generation_settings``): there is no second decoding loop.
The configurations: target-only decoding, the draft model at K = 1..8 and auto, the n-gram
drafter (auto) and n-gram + model (auto). Runs are interleaved per prompt (each prompt through
every configuration, one after the other, so that machine noise hits them alike; the order
rotates from prompt to prompt, so that no configuration always runs first or last) with the same
seed, and both KV caches are emptied before every run (each pays its own prompt, as on the first
turn of a chat; a draft model is only fed once asked to draft).

Speed is generation speed: emitted tokens / (turn time - prompt time). The prompt time is the
target's prefill, the same in every configuration; everything a draft model costs (its own prefill
included) counts. The ratio is against the target-only run of the same prompt; the summary gives
the geometric mean over prompts and the worst prompt. ``same`` is how many tokens match the
target-only output before the first difference (llama.cpp's batched arithmetic differs slightly
from its one-token arithmetic, so greedy outputs may drift apart after a while).

An adaptive (auto) policy lives across prompts, as it lives across turns in the app; a short
warm-up run of every configuration comes first (it also loads pages and caches). With the
transformers backend, transformers' own assisted generation (``num_assistant_tokens=4``) is run
as a reference row.

``repeats`` N runs every prompt through every configuration N times, interleaved, and keeps each
configuration's fastest run: on a shared machine the slow runs are the disturbed ones.
The command-line flags that choose prompts and configurations are in ``chatapp.cli``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from chatapp.backends.base import Backend, ChatMessage
from chatapp.backends.rpc import rpc_label
from chatapp.busy import BusyProcesses
from chatapp.config import DRAFTERS, Config
from chatapp.draft_policy import DraftPolicy
from chatapp.drafting import Drafter, common_prefix_length
from chatapp.engine import GenerationSettings, SpeculativeEngine
from chatapp.events import DoneEvent, StepEvent, TokenEvent
from chatapp.loader import generation_settings, load_backend, make_drafter, make_policy
from chatapp.thread_tuner import ThreadChoice, available_cores, make_thread_choice

PROMPTS_PATH = Path(__file__).resolve().parent / "data" / "bench_prompts.json"
DEFAULT_BENCH_TOKENS = 128
DEFAULT_K_VALUES = tuple(range(1, 9))
WARMUP_TOKENS = 24
BUSY_MAX_S = 3 * 3600  # --busy processes end by themselves after this, whatever happens
TARGET = "target"
NO_EDITS = "-noedit"  # "ngram-noedit", "ngram+model-noedit": without speculative edits


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str


@dataclass(frozen=True)
class RunSpec:
    """One configuration: ``drafter`` None is target-only; ``k`` None is the auto policy;
    ``threads`` a fixed CPU thread count, "auto" (adaptive), or None (as the config says)."""

    drafter: str | None
    k: int | None = None
    threads: str | None = None

    @property
    def name(self) -> str:
        if self.drafter is None:
            base = TARGET
        else:
            k = "auto" if self.k is None else f"K={self.k}"
            base = k if self.drafter == "model" else f"{self.drafter} {k}"
        return base if self.threads is None else f"{base} @{self.threads}"

    @classmethod
    def parse(cls, text: str) -> "RunSpec":
        """``target``, ``auto``, ``3``, or ``DRAFTER:K`` / ``DRAFTER:auto``, each optionally
        followed by ``@N`` (N CPU threads) or ``@auto`` (adaptive threads)."""
        text, _, threads = text.strip().partition("@")
        if threads and threads != "auto" and not (threads.isdigit() and int(threads) >= 1):
            raise ValueError(f"bench configuration {text}@{threads}: the thread count after @ "
                             "must be a number >= 1 or auto")
        return dataclasses.replace(cls._parse_drafter(text.strip()), threads=threads or None)

    @classmethod
    def _parse_drafter(cls, text: str) -> "RunSpec":
        if text == TARGET:
            return cls(None)
        drafter, _, k = text.rpartition(":")
        drafter = drafter or "model"
        if drafter.removesuffix(NO_EDITS) not in DRAFTERS or drafter == "model" + NO_EDITS:
            raise ValueError(f"unknown drafter {drafter!r} in bench configuration {text!r}")
        if k == "auto":
            return cls(drafter, None)
        if k.isdigit() and int(k) >= 1:
            return cls(drafter, int(k))
        raise ValueError(f"bench configuration {text!r}: K must be a number >= 1 or auto")

    def thread_choice(self, cores: int) -> ThreadChoice | None:
        """A new thread choice for one model in this configuration (None: the backend's own)."""
        if self.threads is None:
            return None
        return make_thread_choice(None if self.threads == "auto" else int(self.threads), cores)


def default_specs(k_values: Iterable[int] = DEFAULT_K_VALUES) -> list[RunSpec]:
    return ([RunSpec(None)] + [RunSpec("model", k) for k in k_values]
            + [RunSpec("model"), RunSpec("ngram"), RunSpec("ngram+model")])


@dataclass
class BenchBackends:
    """The loaded models; ``draft`` is loaded on demand when a configuration needs it, and
    ``assistant`` (the draft on the transformers backend) when the assisted-generation reference
    row needs it and the draft runs on another backend."""

    target: Backend
    draft: Backend | None = None
    assistant: Backend | None = None


class ModelClock:
    """A backend seen through a stopwatch: forwards everything to ``backend`` and adds up in
    ``model_s`` the seconds spent in ``evaluate`` and ``truncate``, the calls into the model
    library. What a turn spends outside them is the engine's own per-step work (sampling
    transforms, verification, copies, detokenisation, bookkeeping)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.model_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self.backend.evaluate(tokens, n_logits)
        finally:
            self.model_s += time.perf_counter() - started

    def truncate(self, n: int) -> None:
        started = time.perf_counter()
        try:
            self.backend.truncate(n)
        finally:
            self.model_s += time.perf_counter() - started


def _model_seconds(*backends: Backend | None) -> float:
    return sum(b.model_s for b in backends if isinstance(b, ModelClock))


@dataclass
class Row:
    """One prompt through one configuration."""

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
    repeat_tokens_per_s: list[float] = field(default_factory=list)
    output: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Summary:
    config: str
    prompts: int
    tokens_per_s: float  # all tokens / all generation time
    ratio_geomean: float
    ratio_min: float
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
    category_ratio: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- entry point ------------------------------------------------------------------------------------

def bench_command(config: Config, json_path: Path | None, *,
                  backends: BenchBackends | None = None,
                  prompts: Sequence[BenchPrompt] | None = None,
                  specs: Sequence[RunSpec] | None = None,
                  max_tokens: int | None = None,
                  warmup: bool = True,
                  fresh_policy: bool = False,
                  repeats: int = 1,
                  busy: int = 0,
                  out: TextIO | None = None,
                  log: TextIO | None = None) -> int:
    """Run the bench, print the table to ``out`` (stdout), write all rows to ``json_path``.

    Defaults: every prompt of ``chatapp/data/bench_prompts.json``, ``default_specs()``, and
    ``DEFAULT_BENCH_TOKENS`` new tokens unless the config asks for another ``max_tokens``.
    A set of ``specs`` without target-only decoding gets it added: the ratios need it.
    ``busy`` CPU-bound processes run beside the measured runs (warm-up included), for at most
    ``BUSY_MAX_S`` seconds.
    """
    out = out or sys.stdout
    log = log or sys.stderr
    prompts = load_prompts() if prompts is None else prompts
    specs = default_specs() if specs is None else specs
    if RunSpec(None) not in specs:
        specs = [RunSpec(None), *specs]
    if max_tokens is None:
        max_tokens = (DEFAULT_BENCH_TOKENS if config.max_tokens == Config().max_tokens
                      else config.max_tokens)

    owned = backends is None
    if backends is None:
        backends = BenchBackends(load_backend(config.target, "target", config, _progress(log)))
    try:
        bench = Bench(config, backends, specs, max_tokens, log, fresh_policy, repeats, busy)
        with BusyProcesses(busy, BUSY_MAX_S):
            if warmup:
                bench.warm_up(prompts[0])
            rows = bench.run(prompts)
    finally:
        if owned:
            for backend in (backends.target, backends.draft, backends.assistant):
                if backend is not None:
                    backend.close()
    summaries = summarise(rows, [spec.name for spec in specs] + bench.extra_configs)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_report(out, bench.describe(len(prompts)), summaries, rows, peak_rss_mib)
    if json_path is not None:
        data = {"meta": {**bench.meta(), "prompts": [dataclasses.asdict(p) for p in prompts],
                         "peak_rss_mib": peak_rss_mib},
                "summary": [s.to_json() for s in summaries],
                "rows": [row.to_json() for row in rows]}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"Wrote {json_path}", file=out)
    return 0


def load_prompts(path: Path = PROMPTS_PATH) -> list[BenchPrompt]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [BenchPrompt(p["id"], p["category"], p["text"]) for p in data["prompts"]]


def select_prompts(prompts: list[BenchPrompt], selection: str | None) -> list[BenchPrompt]:
    """All prompts; the first N for a number; else those whose id or category is listed."""
    if not selection:
        return prompts
    if selection.strip().isdigit():
        return prompts[:max(1, int(selection))]
    wanted = {s.strip() for s in selection.split(",")}
    chosen = [p for p in prompts if p.id in wanted or p.category in wanted]
    if not chosen:
        ids = ", ".join(sorted({p.id for p in prompts} | {p.category for p in prompts}))
        raise ValueError(f"no bench prompt id or category matches {selection!r}; known: {ids}")
    return chosen


def _progress(log: TextIO) -> Callable[[str, float | None], None]:
    def report(message: str, fraction: float | None) -> None:
        percent = f" {fraction:.0%}" if fraction is not None else ""
        print(f"{message}{percent}", file=log, flush=True)
    return report


# -- running ----------------------------------------------------------------------------------------

@dataclass
class _Run:
    output: list[int]
    stats: Any
    finish_reason: str
    drafted_per_step: Counter
    policy: str
    model_s: float = 0.0
    speeds: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, config: Config, backends: BenchBackends, specs: Sequence[RunSpec],
                 max_tokens: int, log: TextIO, fresh_policy: bool, repeats: int = 1,
                 busy: int = 0) -> None:
        self.config = config
        self.busy = busy
        self.repeats = max(1, repeats)
        self.backends = backends
        self.specs = list(specs)
        self.log = log
        self.fresh_policy = fresh_policy
        backends.target = ModelClock(backends.target)
        self.settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        self.seed = config.seed if config.seed is not None else 0
        self.extra_configs: list[str] = []
        self._thread_choices: dict[tuple[str, str], ThreadChoice | None] = {}
        self._own_thread_choices: dict[str, ThreadChoice] = {}  # each backend's, by role
        self._engines: dict[str, tuple[SpeculativeEngine, DraftPolicy]] = {}
        for spec in self.specs:
            self._engines[spec.name] = self._engine(spec)
        if config.backend == "hf" and backends.draft is not None:
            self.extra_configs.append(HF_ASSISTED)

    # -- set-up --

    def _draft_backend(self) -> Backend:
        if self.backends.draft is None:
            self.backends.draft = load_backend(self.config.draft, "draft", self.config,
                                               _progress(self.log))
        if not isinstance(self.backends.draft, ModelClock):
            self.backends.draft = ModelClock(self.backends.draft)
        return self.backends.draft

    def _assistant(self) -> Backend:
        """The draft model as a transformers model, for the assisted-generation reference."""
        if self.config.draft_backend_name == "hf":
            return self._draft_backend()
        if self.backends.assistant is None:
            config = dataclasses.replace(self.config, draft_backend="hf")
            self.backends.assistant = load_backend(config.draft, "draft", config,
                                                   _progress(self.log))
        return self.backends.assistant

    def _engine(self, spec: RunSpec) -> tuple[SpeculativeEngine, DraftPolicy]:
        target = self.backends.target
        drafter: Drafter | None = None
        if spec.drafter is not None:
            name = spec.drafter.removesuffix(NO_EDITS)
            config = dataclasses.replace(self.config, drafter=name)
            draft = None if name == "ngram" else self._draft_backend()
            drafter = make_drafter(config, target, draft=draft,
                                   edits=not spec.drafter.endswith(NO_EDITS))
        return SpeculativeEngine(target, drafter), self._policy(spec)

    def _policy(self, spec: RunSpec) -> DraftPolicy:
        length = "0" if spec.drafter is None else ("auto" if spec.k is None else str(spec.k))
        return make_policy(dataclasses.replace(self.config, draft_length=length))

    # -- runs --

    def warm_up(self, prompt: BenchPrompt) -> None:
        """One short run of every configuration, not recorded."""
        print(f"Warming up on {prompt.id} ...", file=self.log, flush=True)
        settings = dataclasses.replace(self.settings,
                                       max_tokens=min(WARMUP_TOKENS, self.settings.max_tokens))
        tokens = self.prompt_tokens(prompt)
        for spec in self.specs:
            engine, policy = self._engines[spec.name]
            self._generate(spec, engine, policy, tokens, settings)

    def run(self, prompts: Sequence[BenchPrompt]) -> list[Row]:
        rows: list[Row] = []
        try:
            for number, prompt in enumerate(prompts, 1):
                rows.extend(self._run_prompt(prompt, number, len(prompts)))
        except KeyboardInterrupt:
            print("Interrupted: reporting the prompts that completed.", file=self.log)
        return rows

    def _run_prompt(self, prompt: BenchPrompt, number: int, total: int) -> list[Row]:
        tokens = self.prompt_tokens(prompt)
        runs: dict[str, _Run] = {}
        speeds: dict[str, list[float]] = {}
        for repeat in range(self.repeats):
            for spec in rotated(self.specs, number - 1 + repeat):
                engine, policy = self._engines[spec.name]
                if self.fresh_policy and spec.drafter is not None and spec.k is None:
                    policy = self._policy(spec)
                    self._engines[spec.name] = (engine, policy)
                run = self._generate(spec, engine, policy, tokens, self.settings, seed=number)
                self._log_run(number, total, prompt, spec.name, run)
                speeds.setdefault(spec.name, []).append(_generation_speed(run.stats))
                best = runs.get(spec.name)
                if best is None or _generation_speed(run.stats) > _generation_speed(best.stats):
                    runs[spec.name] = run  # the fastest repeat: least disturbed by the machine
        for name, run in runs.items():
            run.speeds = speeds[name]
        if HF_ASSISTED in self.extra_configs:
            runs[HF_ASSISTED] = hf_assisted(self.backends.target, self._assistant(), tokens,
                                            self.settings.max_tokens,
                                            runs[TARGET].stats.prompt_s)
            self._log_run(number, total, prompt, HF_ASSISTED, runs[HF_ASSISTED])
        reference = runs[TARGET]
        return [make_row(prompt, name, run, reference) for name, run in runs.items()]

    def prompt_tokens(self, prompt: BenchPrompt) -> list[int]:
        system = [ChatMessage("system", self.config.system_prompt)] if (
            self.config.system_prompt) else []
        return self.backends.target.chat_prompt(system + [ChatMessage("user", prompt.text)])

    def _use_threads_of(self, spec: RunSpec) -> None:
        """Give each loaded model the thread choice of ``spec`` (kept per configuration, so an
        adaptive one learns across prompts as across turns), or its own one back."""
        if all(s.threads is None for s in self.specs):
            return
        for role, backend in (("target", self.backends.target), ("draft", self.backends.draft)):
            if backend is None:
                continue
            own = self._own_thread_choices.setdefault(role, backend.thread_choice)
            key = (spec.name, role)
            if key not in self._thread_choices:
                self._thread_choices[key] = spec.thread_choice(available_cores())
            backend.use_threads(self._thread_choices[key] or own)

    def _generate(self, spec: RunSpec, engine: SpeculativeEngine, policy: DraftPolicy,
                  prompt: list[int], settings: GenerationSettings, seed: int = 0) -> _Run:
        self._use_threads_of(spec)
        for backend in (self.backends.target, self.backends.draft):
            if backend is not None:
                backend.truncate(0)
        rng = np.random.default_rng([self.seed, seed])
        output: list[int] = []
        drafted: Counter = Counter()
        done: DoneEvent | None = None
        model_before = _model_seconds(self.backends.target, self.backends.draft)
        for event in engine.generate(prompt, settings, rng, policy):
            if isinstance(event, TokenEvent):
                output.append(event.id)
            elif isinstance(event, StepEvent):
                drafted[event.drafted] += 1
            elif isinstance(event, DoneEvent):
                done = event
        assert done is not None
        model_s = _model_seconds(self.backends.target, self.backends.draft) - model_before
        return _Run(output, done.stats, done.finish_reason.value, drafted, policy.label, model_s)

    def _log_run(self, number: int, total: int, prompt: BenchPrompt, name: str, run: _Run) -> None:
        speed = _generation_speed(run.stats)
        print(f"[{number}/{total}] {prompt.id:<16} {name:<18} {run.stats.tokens:4d} tokens "
              f"{speed:6.1f} tok/s  {run.policy}  threads {run.stats.threads}", file=self.log,
              flush=True)

    # -- description --

    def meta(self) -> dict[str, Any]:
        target, draft = self.backends.target, self.backends.draft
        sampling = self.settings.sampling
        return {"backend": self.config.backend, "draft_backend": self.config.draft_backend_name,
                "target": target.name,
                "draft": draft.name if draft is not None else None,
                "temperature": sampling.temperature, "top_k": sampling.top_k,
                "top_p": sampling.top_p, "max_tokens": self.settings.max_tokens,
                "seed": self.seed, "threads": self.config.threads, "n_ctx": self.config.n_ctx,
                "fresh_policy": self.fresh_policy, "repeats": self.repeats, "busy": self.busy,
                "cpus": os.cpu_count(), "target_rpc": list(self.config.rpc),
                "configs": [spec.name for spec in self.specs] + self.extra_configs}

    def describe(self, n_prompts: int) -> str:
        meta = self.meta()
        mode = "greedy" if self.settings.sampling.greedy else (
            f"temperature {meta['temperature']}, top-k {meta['top_k']}, top-p {meta['top_p']}")
        policy = "a new auto policy per prompt" if self.fresh_policy else (
            "auto policies kept across prompts, as across turns")
        if self.repeats > 1:
            policy += f"; fastest of {self.repeats} interleaved repeats per prompt"
        if self.busy:
            policy += f"; {self.busy} CPU-bound process{'es' if self.busy > 1 else ''} beside it"
        backend = meta["backend"] if meta["draft_backend"] == meta["backend"] else (
            f"{meta['backend']} (draft on {meta['draft_backend']})")
        where = f" {rpc_label(self.config.rpc)}" if self.config.rpc else ""
        return (f"specchat bench: target {meta['target']}{where}, draft {meta['draft'] or '-'}, backend "
                f"{backend}, {mode}, up to {meta['max_tokens']} new tokens, {n_prompts} "
                f"prompts, seed {meta['seed']}; {policy}.")


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """``items`` starting at index ``shift`` (mod len): each configuration runs at every place in
    the order in turn, so that whatever drifts along a round (a warming CPU, caches a heavier
    configuration just evicted, a neighbour's job) does not always hit the same one."""
    shift %= max(len(items), 1)
    return list(items[shift:]) + list(items[:shift])


def _generation_speed(stats: Any) -> float:
    seconds = stats.total_s - stats.prompt_s
    return stats.tokens / seconds if seconds > 0 else 0.0


def make_row(prompt: BenchPrompt, name: str, run: _Run, reference: _Run) -> Row:
    stats = run.stats
    speed = _generation_speed(stats)
    reference_speed = _generation_speed(reference.stats)
    same = common_prefix_length(run.output, reference.output)
    return Row(
        prompt=prompt.id, category=prompt.category, config=name, tokens=stats.tokens,
        tokens_per_s=speed, e2e_tokens_per_s=stats.tokens_per_s,
        ratio=speed / reference_speed if reference_speed > 0 else 0.0,
        acceptance_rate=stats.acceptance_rate, mean_accepted_length=stats.mean_accepted_length,
        drafted=stats.drafted, accepted=stats.accepted, target_calls=stats.target_calls,
        draft_s=stats.draft_s, verify_s=stats.verify_s, prompt_s=stats.prompt_s,
        other_s=stats.other_s, total_s=stats.total_s, model_s=run.model_s,
        engine_share=_engine_share(stats.total_s, stats.prompt_s, run.model_s),
        ttft_s=stats.ttft_s,
        same_as_target=same, identical=run.output == reference.output,
        finish_reason=run.finish_reason, policy=run.policy,
        drafted_per_step={str(k): v for k, v in sorted(run.drafted_per_step.items())},
        repeat_tokens_per_s=list(run.speeds) or [speed], output=list(run.output))


def _engine_share(total_s: float, prompt_s: float, model_s: float) -> float:
    """The engine's own time (everything outside the model calls) over the generation time."""
    generation_s = total_s - prompt_s
    return max(0.0, total_s - model_s) / generation_s if generation_s > 0 and model_s > 0 else 0.0


# -- summary and report -----------------------------------------------------------------------------

def geometric_mean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def summarise(rows: Sequence[Row], configs: Sequence[str]) -> list[Summary]:
    summaries = []
    for name in configs:
        mine = [row for row in rows if row.config == name]
        if not mine:
            continue
        worst = min(mine, key=lambda row: row.ratio)
        tokens = sum(row.tokens for row in mine)
        generation_s = sum(row.total_s - row.prompt_s for row in mine)
        drafted = sum(row.drafted for row in mine)
        calls = sum(row.target_calls for row in mine)
        categories: dict[str, list[float]] = {}
        for row in mine:
            categories.setdefault(row.category, []).append(row.ratio)
        summaries.append(Summary(
            config=name, prompts=len(mine),
            tokens_per_s=tokens / generation_s if generation_s > 0 else 0.0,
            ratio_geomean=geometric_mean([row.ratio for row in mine]),
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
            category_ratio={c: geometric_mean(r) for c, r in categories.items()}))
    return summaries


def print_report(out: TextIO, title: str, summaries: Sequence[Summary], rows: Sequence[Row],
                 peak_rss_mib: float) -> None:
    print(title, file=out)
    if not summaries:
        print("No complete run.", file=out)
        return
    reference_tokens = sum(row.tokens for row in rows if row.config == TARGET) / max(
        1, sum(1 for row in rows if row.config == TARGET))
    header = (f"{'configuration':<18} {'tok/s':>6} {'x target':>8} {'min x (prompt)':>24} "
              f"{'accept':>6} {'tok/call':>8} {'draft':>6} {'verify':>6} {'prompt':>6} "
              f"{'other':>6} {'engine':>6} {'same as target':>16}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for s in summaries:
        total = s.total_s or 1.0
        accept = f"{s.acceptance_rate:.0%}" if s.acceptance_rate or s.config != TARGET else "-"
        worst = f"{s.ratio_min:.2f} ({s.ratio_min_prompt})"
        same = f"{s.same_as_target:.0f} of {reference_tokens:.0f}, {s.identical}/{s.prompts} all"
        engine = f"{s.engine_share:.1%}" if s.engine_share else "-"
        print(f"{s.config:<18} {s.tokens_per_s:6.1f} {s.ratio_geomean:8.2f} {worst:>24} "
              f"{accept:>6} {s.mean_accepted_length:8.2f} {s.draft_s / total:6.0%} "
              f"{s.verify_s / total:6.0%} {s.prompt_s / total:6.0%} {s.other_s / total:6.0%} "
              f"{engine:>6} {same:>16}", file=out)
    categories = list(dict.fromkeys(row.category for row in rows))
    print("", file=out)
    print(f"{'x target, by category':<18} " + " ".join(f"{c:>10}" for c in categories), file=out)
    for s in summaries:
        print(f"{s.config:<18} " + " ".join(f"{s.category_ratio.get(c, 0.0):>10.2f}"
                                             for c in categories), file=out)
    print("", file=out)
    prompts = list(dict.fromkeys(row.prompt for row in rows))
    names = [s.config for s in summaries]
    print(f"{'x target, by prompt':<18} " + " ".join(names), file=out)
    by_key = {(row.prompt, row.config): row for row in rows}
    for prompt in prompts:
        cells = " ".join(f"{by_key[(prompt, n)].ratio:>{len(n)}.2f}" if (prompt, n) in by_key
                         else " " * len(n) for n in names)
        print(f"{prompt:<18} {cells}", file=out)
    print("", file=out)
    print("Speed: tokens / (turn time - prompt time); time split as shares of the whole turn; "
          "engine: the engine's own work (everything outside the models' evaluate/truncate "
          "calls) as a share of the generation time; same as target: tokens equal to the target-only output before the first difference "
          "(mean over prompts; n/m all: outputs identical to it).", file=out)
    print(f"Peak RSS: {peak_rss_mib:.0f} MiB", file=out)


# -- transformers' assisted generation, as a reference ----------------------------------------------

HF_ASSISTED = "hf assisted K=4"


def _torch_model(backend: Backend) -> Any:
    model = getattr(backend, "model", None)
    if model is None:
        model = getattr(backend, "_model", None)  # TransformersBackend keeps it private for now
    if model is None:
        raise RuntimeError(f"{backend.name}: the backend does not expose its torch model")
    return model


def hf_assisted(target: Backend, draft: Backend, prompt: list[int], max_tokens: int,
                prompt_s: float) -> _Run:
    """transformers' ``generate(assistant_model=...)``, greedy, 4 assistant tokens.

    Its generation time is the whole call minus the target-only prefill time of the same prompt
    (``prompt_s``), an estimate, as ``generate`` does not report its prefill separately.
    """
    import torch

    from chatapp.stats import TurnStats

    model, assistant = _torch_model(target), _torch_model(draft)
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt], device=device)
    stop = sorted(target.stop_ids)
    started = time.perf_counter()
    with torch.inference_mode():
        result = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                assistant_model=assistant, num_assistant_tokens=4,
                                do_sample=False, max_new_tokens=max_tokens,
                                eos_token_id=stop, pad_token_id=stop[0] if stop else None)
    total_s = time.perf_counter() - started
    output = [int(t) for t in result[0, len(prompt):].tolist()]
    finish = "length"
    for i, token in enumerate(output):
        if token in target.stop_ids:
            output, finish = output[:i], "stop"
            break
    stats = TurnStats(tokens=len(output), prompt_tokens=len(prompt),
                      prompt_s=min(prompt_s, total_s), total_s=total_s)
    return _Run(output, stats, finish, Counter(), "4 (transformers)")
