"""The bench's runs: every configuration's engine on the loaded models, interleaved per prompt in
rounds (each round every configuration once, the order rotated from round to round)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from chatapp.assembly.loader import ensure_calibration, load_backend, make_drafter, make_policy
from chatapp.backends.base import Backend
from chatapp.backends.threads import ThreadChoice, available_cores
from chatapp.bench.baseline import BASELINE, Launcher, baseline_row
from chatapp.bench.hf_reference import HF_ASSISTED, hf_assisted
from chatapp.bench.policy_memory import MemoryState, PolicyMemory, memory_state, spec_config
from chatapp.bench.report import Row, Run, RunRecord, compared_to, make_row
from chatapp.bench.specs import NO_EDITS, TARGET, BenchPrompt, RunSpec
from chatapp.chat.message import ChatMessage
from chatapp.chat.reply_settings import generation_settings
from chatapp.chat.reply_values import k_label
from chatapp.chat.session import ChatSession, ReplyOverrides
from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import Drafter, DraftPolicy
from chatapp.engine.events import DoneEvent, StepEvent, TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.stats import SourceTally
from chatapp.settings.config import Config, rpc_label

WARMUP_TOKENS = 24


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


@dataclass(frozen=True)
class Configuration:
    """One configuration the bench reports: a ``spec`` and, for an adaptive one, the state its
    policy starts each run from (``start``; None for a fixed K or target-only)."""

    name: str
    spec: RunSpec
    start: MemoryState | None = None


def _model_seconds(*backends: Backend | None) -> float:
    return sum(b.model_s for b in backends if isinstance(b, ModelClock))


def progress_printer(log: TextIO) -> Callable[[str, float | None], None]:
    """A loader progress callback that prints each message (and its share done) to ``log``."""
    def report(message: str, fraction: float | None) -> None:
        percent = f" {fraction:.0%}" if fraction is not None else ""
        print(f"{message}{percent}", file=log, flush=True)
    return report


RUN_SEEDS = 1_000_003  # a run's seed: the bench's seed x this + the prompt's number


def _asked(prompt: BenchPrompt) -> list[ChatMessage]:
    """``prompt`` as the message a person would send."""
    return [ChatMessage("user", prompt.text)]


class Bench:
    """Every configuration of ``specs`` as an engine and a policy on the shared ``backends``
    (built once); ``warm_up`` and ``run`` decode through them, ``meta`` and ``describe`` say what
    was measured, ``records`` holds every run.

    An adaptive configuration runs once per state of ``memories``
    (``chatapp.bench.policy_memory``): from a new policy every run, from the memory the app
    persisted for its setup, or (``KEPT``) with one policy learning across every run."""

    def __init__(self, config: Config, backends: BenchBackends, specs: Sequence[RunSpec],
                 max_tokens: int, log: TextIO, repeats: int = 1,
                 busy: int = 0, baseline: Sequence[str] | None = None,
                 launcher: Launcher | None = None,
                 memories: Sequence[PolicyMemory] = (PolicyMemory.KEPT,)) -> None:
        """``baseline``: the Python command of another installation whose target-only run of
        each prompt goes just before this bench's, started by ``launcher``
        (``chatapp.bench.baseline``)."""
        self.config = config
        self.baseline = list(baseline) if baseline else None
        self.launcher = launcher
        self.busy = busy
        self.repeats = max(1, repeats)
        self.backends = backends
        self.specs = list(specs)
        self.log = log
        self.memories = tuple(memories)
        self.configurations = [c for spec in self.specs for c in self._configurations(spec)]
        self.records: list[RunRecord] = []
        backends.target = ModelClock(backends.target)
        self.settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        self.seed = config.seed if config.seed is not None else 0
        self.extra_configs: list[str] = []
        self._thread_choices: dict[tuple[str, str], ThreadChoice | None] = {}
        self._own_thread_choices: dict[str, ThreadChoice] = {}  # each backend's, by role
        self._sessions: dict[str, tuple[ChatSession, DraftPolicy]] = {}
        self._calibrations: dict[str, Calibration] = {}  # by spec name (``_calibration``)
        for spec in self.specs:
            self._sessions[spec.name] = self._session(spec)
        self._warn_of_missing_memory()
        if config.backend == "hf" and backends.draft is not None:
            self.extra_configs.append(HF_ASSISTED)

    # -- set-up --

    def _warn_of_missing_memory(self) -> None:
        """Say, before any run, which ``LEARNT`` configurations found no memory to resume (they
        run as fresh ones) and how to give them one."""
        for configuration in self.configurations:
            start = configuration.start
            if start is not None and start.found_nothing:
                print(f"Note: {configuration.name} found no learnt policy memory for its setup "
                      f"({start.path}), so it starts fresh like a new install. Reply with "
                      "specchat run or the app (same model pair, drafter and threads) first to "
                      "give it one.", file=self.log, flush=True)

    def _draft_backend(self) -> Backend:
        if self.backends.draft is None:
            self.backends.draft = load_backend(self.config.draft, "draft", self.config,
                                               progress_printer(self.log),
                                               self.backends.target.n_ctx)
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
                                                   progress_printer(self.log),
                                                   self.backends.target.n_ctx)
        return self.backends.assistant

    def _session(self, spec: RunSpec) -> tuple[ChatSession, DraftPolicy]:
        """The reply pipeline a configuration runs through (its drafter over the loaded models,
        as the app's), and its own policy."""
        target = self.backends.target
        drafter: Drafter | None = None
        if spec.drafter is not None:
            name = spec.drafter.removesuffix(NO_EDITS)
            config = dataclasses.replace(self.config, drafter=name)
            draft = None if name == "ngram" else self._draft_backend()
            drafter = make_drafter(config, target, draft=draft,
                                   edits=not spec.drafter.endswith(NO_EDITS))
        session = ChatSession(SpeculativeEngine(target, drafter), self.settings, self.seed,
                              self.config.system_prompt)
        return session, self._policy(spec)

    def _policy(self, spec: RunSpec) -> DraftPolicy:
        """The spec's own policy; an adaptive one starts from this machine's calibration
        (``_calibration``), as in the app."""
        return make_policy(spec_config(self.config, spec), self._calibration(spec))

    def _calibration(self, spec: RunSpec) -> Calibration | None:
        """This machine's costs for an adaptive ``spec``'s setup, measured once if none are kept
        (``ensure_calibration``); None for a fixed K."""
        if spec.drafter is None or spec.k is not None:
            return None
        if spec.name not in self._calibrations:
            config = spec_config(self.config, spec)
            draft = None if config.drafter == "ngram" else self._draft_backend()
            self._calibrations[spec.name] = ensure_calibration(
                config, self.backends.target, draft, progress_printer(self.log))
        return self._calibrations[spec.name]

    def _configurations(self, spec: RunSpec) -> list[Configuration]:
        """``spec`` as the bench reports it: once, or an adaptive one once per memory state
        (named "auto [fresh]", "auto [learnt]" when there are several)."""
        if spec.drafter is None or spec.k is not None:
            return [Configuration(spec.name, spec)]
        several = len(self.memories) > 1
        return [Configuration(f"{spec.name} [{memory.value}]" if several else spec.name, spec,
                              memory_state(self.config, spec, memory))
                for memory in self.memories]

    def _run_policy(self, configuration: Configuration) -> DraftPolicy:
        """The policy of one run: the configuration's own one (fixed K, or ``KEPT``), else a new
        one from the configuration's start."""
        start = configuration.start
        if start is None or start.memory is PolicyMemory.KEPT:
            return self._sessions[configuration.spec.name][1]
        return start.new_policy(spec_config(self.config, configuration.spec),
                                self._calibration(configuration.spec))

    # -- runs --

    def warm_up(self, prompt: BenchPrompt) -> None:
        """One short run of every configuration, not recorded."""
        print(f"Warming up on {prompt.id} ...", file=self.log, flush=True)
        settings = dataclasses.replace(self.settings,
                                       max_tokens=min(WARMUP_TOKENS, self.settings.max_tokens))
        for configuration in self.configurations:
            spec = configuration.spec
            session = self._sessions[spec.name][0]
            self._generate(spec, session, self._run_policy(configuration), _asked(prompt),
                           settings)

    def run(self, prompts: Sequence[BenchPrompt]) -> list[Row]:
        rows: list[Row] = []
        try:
            for number, prompt in enumerate(prompts, 1):
                rows.extend(self._run_prompt(prompt, number, len(prompts)))
        except KeyboardInterrupt:
            print("Interrupted: reporting the prompts that completed.", file=self.log)
        return rows

    def _run_prompt(self, prompt: BenchPrompt, number: int, total: int) -> list[Row]:
        """``prompt`` through every configuration in ``repeats`` rounds (see ``_run_round``),
        after the baseline's run of it if any; one row per configuration."""
        base = None
        if self.baseline and self.launcher is not None:
            base = baseline_row(self.launcher, self.baseline, prompt, self.settings.max_tokens,
                                self.config)
            print(f"[{number}/{total}] {prompt.id:<16} {BASELINE:<18} {base.tokens:4d} tokens "
                  f"{base.tokens_per_s:6.1f} tok/s", file=self.log, flush=True)
        rounds = [self._run_round(prompt, number, total, repeat)
                  for repeat in range(self.repeats)]
        memories = {c.name: c.start.describe() for c in self.configurations if c.start}
        references = [runs[TARGET] for runs in rounds]
        rows = [make_row(prompt, name, [runs[name] for runs in rounds], references,
                         memories.get(name, "")) for name in rounds[0]]
        if base is not None:
            rows.append(compared_to(base, rows[[row.config for row in rows].index(TARGET)]))
        return rows

    def _run_round(self, prompt: BenchPrompt, number: int, total: int, repeat: int
                   ) -> dict[str, Run]:
        """Round ``repeat`` of ``prompt``: every configuration once, in the order rotated by the
        prompt's number and the round (no configuration always runs first), then the
        transformers reference if any; each run is added to ``records``."""
        runs: dict[str, Run] = {}
        order = rotated(self.configurations, number - 1 + repeat)
        for configuration in order:
            spec = configuration.spec
            session = self._sessions[spec.name][0]
            run = self._generate(spec, session, self._run_policy(configuration), _asked(prompt),
                                 self.settings, seed=number)
            self._log_run(number, total, prompt, configuration.name, run)
            runs[configuration.name] = run
        if HF_ASSISTED in self.extra_configs:
            tokens = self.prompt_tokens(prompt)
            runs[HF_ASSISTED] = hf_assisted(self.backends.target, self._assistant(), tokens,
                                            self.settings.max_tokens, runs[TARGET].stats.prompt_s)
            self._log_run(number, total, prompt, HF_ASSISTED, runs[HF_ASSISTED])
        self.records += [RunRecord.of(prompt.id, name, repeat, position, run, runs[TARGET])
                         for position, (name, run) in enumerate(runs.items())]
        return {name: runs[name] for name in self.names if name in runs}

    def run_once(self, spec: RunSpec, messages: Sequence[ChatMessage], seed: int) -> Run:
        """One run of configuration ``spec`` (one of ``specs``) replying to ``messages``, both
        caches emptied first, with the bench's settings; for other benches built on this one."""
        session, policy = self._sessions[spec.name]
        return self._generate(spec, session, policy, messages, self.settings, seed=seed)

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

    def _generate(self, spec: RunSpec, session: ChatSession, policy: DraftPolicy,
                  messages: Sequence[ChatMessage], settings: GenerationSettings,
                  seed: int = 0) -> Run:
        """One reply to ``messages`` through ``session``'s pipeline (the app's prompt rules),
        ``settings.max_tokens`` at most, sampling from a generator seeded by the bench's seed
        and ``seed``."""
        self._use_threads_of(spec)
        for backend in (self.backends.target, self.backends.draft):
            if backend is not None:
                backend.truncate(0)
        overrides = ReplyOverrides(max_tokens=settings.max_tokens,
                                   seed=self.seed * RUN_SEEDS + seed)
        _, events = session.reply(messages, policy, overrides=overrides)
        output: list[int] = []
        drafted: Counter = Counter()
        by_source: dict[str, SourceTally] = {}
        done: DoneEvent | None = None
        model_before = _model_seconds(self.backends.target, self.backends.draft)
        for event in events:
            if isinstance(event, TokenEvent):
                output.append(event.id)
            elif isinstance(event, StepEvent):
                drafted[event.drafted] += 1
                if event.drafted:
                    by_source.setdefault(event.source, SourceTally()).add(
                        event.drafted, event.accepted, event.draft_s)
            elif isinstance(event, DoneEvent):
                done = event
        assert done is not None
        model_s = _model_seconds(self.backends.target, self.backends.draft) - model_before
        label = k_label(policy.current_k(), policy.adaptive)
        return Run(output, done.stats, done.finish_reason.value, drafted, label, model_s,
                   by_source)

    def _log_run(self, number: int, total: int, prompt: BenchPrompt, name: str, run: Run) -> None:
        print(f"[{number}/{total}] {prompt.id:<16} {name:<18} {run.stats.tokens:4d} tokens "
              f"{run.speed:6.1f} tok/s  {run.policy}  threads {run.stats.threads}", file=self.log,
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
                "policy_memory": [memory.value for memory in self.memories],
                "memory_states": {c.name: c.start.to_json() for c in self.configurations
                                  if c.start is not None},
                "calibrations": {name: costs.as_data()
                                 for name, costs in self._calibrations.items()},
                "repeats": self.repeats, "rounds": self.repeats, "busy": self.busy,
                "cpus": os.cpu_count(), "target_rpc": list(self.config.rpc),
                "configs": self.names, **machine_facts(self.config)}

    @property
    def names(self) -> list[str]:
        """The configurations' names, as the rows have them, in order."""
        return [c.name for c in self.configurations] + self.extra_configs

    def describe(self, n_prompts: int) -> str:
        meta = self.meta()
        mode = "greedy" if self.settings.sampling.greedy else (
            f"temperature {meta['temperature']}, top-k {meta['top_k']}, top-p {meta['top_p']}")
        policy = "auto policies " + " and ".join(_MEMORY_WORDS[m] for m in self.memories)
        if self.repeats > 1:
            policy += (f"; {self.repeats} interleaved rounds per prompt, ratios paired within a "
                       "round, medians over the rounds")
        if self.busy:
            policy += f"; {self.busy} CPU-bound process{'es' if self.busy > 1 else ''} beside it"
        backend = meta["backend"] if meta["draft_backend"] == meta["backend"] else (
            f"{meta['backend']} (draft on {meta['draft_backend']})")
        where = f" {rpc_label(self.config.rpc)}" if self.config.rpc else ""
        amx = {True: "AMX in use", False: "AMX not in use", None: ""}[meta["amx_in_use"]]
        return (f"specchat bench: target {meta['target']}{where}, draft {meta['draft'] or '-'}, "
                f"backend {backend}, {mode}, up to {meta['max_tokens']} new tokens, {n_prompts} "
                f"prompts, seed {meta['seed']}; {policy}. CPU: {meta['cpu']}"
                f"{'; ' + amx if amx else ''}; layout setting {meta['layout']}."
                f"{self._memory_note()}")

    def _memory_note(self) -> str:
        """" Policy memory: auto: fresh; ngram auto: learnt (sources: ...)." (empty without an
        adaptive configuration)."""
        states = [f"{c.name}: {c.start.describe()}" for c in self.configurations if c.start]
        return f" Policy memory: {'; '.join(states)}." if states else ""


_MEMORY_WORDS = {PolicyMemory.FRESH: "fresh every run",
                 PolicyMemory.LEARNT: "resumed every run from the memory the app keeps",
                 PolicyMemory.KEPT: "kept across prompts, as across turns"}


def machine_facts(config: Config) -> dict[str, Any]:
    """The CPU (``lscpu``'s model name, whether it has AMX), whether llama.cpp runs AMX here
    (None: no llama.cpp model) and the layout setting, for the bench's report."""
    from chatapp.backends.amx_guard import cpu_description, cpu_flags, cpu_has_amx, cpu_model_name

    amx = None
    if "llama" in (config.backend, config.draft_backend_name):
        from chatapp.backends.llama_runtime import amx_in_use

        amx = amx_in_use()
    return {"cpu": cpu_description(), "cpu_model": cpu_model_name(),
            "cpu_has_amx": cpu_has_amx(cpu_flags()), "amx_in_use": amx, "layout": config.layout}


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """``items`` starting at index ``shift`` (mod len): each configuration runs at every place in
    the order in turn, so that whatever drifts along a round (a warming CPU, caches a heavier
    configuration just evicted, a neighbour's job) does not always hit the same one."""
    shift %= max(len(items), 1)
    return list(items[shift:]) + list(items[:shift])

