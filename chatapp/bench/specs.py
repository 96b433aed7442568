"""The bench's prompts and configurations: ``BenchPrompt``, ``RunSpec`` and the default set."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from chatapp.backends.threads import ThreadChoice, make_thread_choice
from chatapp.bench.file_prompts import with_file_variants
from chatapp.settings.options import DRAFTERS

PROMPTS_PATH = Path(__file__).resolve().parent.parent / "data" / "bench_prompts.json"
DEFAULT_K_VALUES = tuple(range(1, 9))
TARGET = "target"  # the name of the target-only configuration, the reference of every ratio
NO_EDITS = "-noedit"  # "ngram-noedit", "ngram+model-noedit": without speculative edits


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of the set: its ``id``, its ``category`` and the user message ``text``."""

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
    """Target-only, the draft model at each K of ``k_values`` and auto, n-gram, n-gram + model."""
    return ([RunSpec(None)] + [RunSpec("model", k) for k in k_values]
            + [RunSpec("model"), RunSpec("ngram"), RunSpec("ngram+model")])


def load_prompts(path: Path = PROMPTS_PATH) -> list[BenchPrompt]:
    """The prompts of the JSON file ``path`` (``{"prompts": [{"id", "category", "text"}]}``)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [BenchPrompt(p["id"], p["category"], p["text"]) for p in data["prompts"]]


def select_prompts(prompts: list[BenchPrompt], selection: str | None) -> list[BenchPrompt]:
    """All ``prompts``; the first N for a number; else those whose id or category is listed,
    among ``prompts`` and their file variants (``chatapp.bench.file_prompts``), each variant
    right after its prompt."""
    if not selection:
        return prompts
    if selection.strip().isdigit():
        return prompts[:max(1, int(selection))]
    wanted = {s.strip() for s in selection.split(",")}
    offered = with_file_variants(prompts)
    chosen = [p for p in offered if p.id in wanted or p.category in wanted]
    if not chosen:
        ids = ", ".join(sorted({p.id for p in offered} | {p.category for p in offered}))
        raise ValueError(f"no bench prompt id or category matches {selection!r}; known: {ids}")
    return chosen
