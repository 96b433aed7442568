"""What an adaptive configuration's policy starts each bench run from: nothing, or the memory the
app persisted for that setup (``chatapp.policy.measurements``).

``PolicyMemory.FRESH`` runs every time from a new policy, as the first reply of a new install;
``LEARNT`` from the memory file the app, ``specchat run`` and ``specchat serve`` keep for the
configuration's setup (the same file they would recall: the config with the configuration's
drafter and threads), as the first reply after a restart. The file is read once, when the bench
starts, and never written: every round starts from the same state, whatever runs beside the bench.
``KEPT`` is one policy per configuration for the whole bench, learning from run to run as from
turn to turn of one chat (the scripted conversation and the llama.cpp comparison use it).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.assembly.loader import make_policy
from chatapp.bench.specs import NO_EDITS, RunSpec
from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import DraftPolicy
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.measurements import memory_path, recall
from chatapp.settings.config import Config


class PolicyMemory(enum.Enum):
    FRESH = "fresh"
    LEARNT = "learnt"
    KEPT = "kept"


# ``--policy-memory``'s choices: the memory states each adaptive configuration runs with
MEMORY_CHOICES: dict[str, tuple[PolicyMemory, ...]] = {
    "fresh": (PolicyMemory.FRESH,), "learnt": (PolicyMemory.LEARNT,),
    "both": (PolicyMemory.FRESH, PolicyMemory.LEARNT)}


@dataclass(frozen=True)
class MemoryState:
    """The state an adaptive configuration's policy starts from: ``memory``; for ``LEARNT`` the
    file read and what it held (``learnt``: None when it held nothing this policy can resume)."""

    memory: PolicyMemory
    path: Path | None = None
    learnt: dict[str, Any] | None = None

    @property
    def found_nothing(self) -> bool:
        """A ``LEARNT`` state whose file held nothing to resume: it runs as a fresh one."""
        return self.memory is PolicyMemory.LEARNT and self.learnt is None

    def describe(self) -> str:
        """"fresh", "kept", "learnt (sources: model, suffix)" or "learnt: none found (fresh)"."""
        if self.memory is not PolicyMemory.LEARNT:
            return self.memory.value
        if self.found_nothing:
            return "learnt: none found (fresh)"
        return f"learnt (sources: {', '.join(sorted(self.learnt['arms'])) or 'none'})"

    def to_json(self) -> dict[str, Any]:
        return {"memory": self.memory.value, "state": self.describe(),
                "file": str(self.path) if self.path else None, "learnt": self.learnt}

    def new_policy(self, config: Config, costs: Calibration | None = None) -> DraftPolicy:
        """A policy as ``config`` asks for, calibrated with ``costs``, started from this state."""
        policy = make_policy(config, costs)
        if self.learnt is not None and isinstance(policy, AutoDraftLength):
            policy.resume(copy.deepcopy(self.learnt))
        return policy


def spec_config(config: Config, spec: RunSpec) -> Config:
    """``config`` as configuration ``spec`` runs it: its drafter, its fixed thread count, its K
    ("0" target-only, "auto" adaptive)."""
    threads = int(spec.threads) if spec.threads and spec.threads.isdigit() else (
        None if spec.threads == "auto" else config.threads)
    length = "0" if spec.drafter is None else ("auto" if spec.k is None else str(spec.k))
    drafter = config.drafter if spec.drafter is None else spec.drafter.removesuffix(NO_EDITS)
    return dataclasses.replace(config, drafter=drafter, threads=threads, draft_length=length)


def memory_state(config: Config, spec: RunSpec, memory: PolicyMemory) -> MemoryState:
    """The state configuration ``spec`` starts from under ``memory``: for ``LEARNT`` a snapshot
    of what the app persisted for its setup (checked: a policy can resume from it)."""
    if memory is not PolicyMemory.LEARNT:
        return MemoryState(memory)
    own = spec_config(config, spec)
    path = memory_path(own.measured_setup())
    probe = make_policy(own)
    if not isinstance(probe, AutoDraftLength) or not recall(probe, path):
        return MemoryState(memory, path)
    return MemoryState(memory, path, probe.learnt())
