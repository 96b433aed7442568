"""The draft length K of a conversation or a server: one handle that the engine drafts with for
good, which owns the swap between a fixed K and the adaptive policy, what the adaptive policy
remembers from one run to the next, and whether K still follows the configuration.

``DraftLength`` is a ``DraftPolicy``: the engine keeps the handle it was given for the whole reply
and asks it for a budget at every step, so a K the user picks (keys, the command palette) or a new
configuration replaces what stands behind it from the next step. While K follows the configuration
(``PolicySetting``), another pair of models starts it afresh; once the user picked K another way,
that choice stays. An adaptive policy starts from what the last run with the same measured setup
kept, once the models are loaded, and ``remember`` keeps its measurements
(``chatapp.policy.measurements``). Thread-safe: the engine runs in a worker while a front end
adjusts K.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import (
    MAX_DRAFT_LENGTH,
    DraftBudget,
    DraftPolicy,
    StepOutcome,
)
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import FixedDraftLength
from chatapp.policy.measurements import memory_path, recall, remember


@dataclass(frozen=True)
class PolicySetting:
    """What the configuration says of K: ``fixed`` (None: "auto", the adaptive policy) and the
    ``setup`` whose measurements an adaptive policy keeps (``Config.measured_setup``)."""

    fixed: int | None
    setup: tuple[str, ...] = ()

    def policy(self, costs: Calibration | None = None) -> DraftPolicy:
        """A fresh policy as configured: a fixed K, or an ``AutoDraftLength`` (it learns each
        source of the drafter from what the engine reports), calibrated with ``costs`` if
        given."""
        if self.fixed is not None:
            return FixedDraftLength(self.fixed)
        policy = AutoDraftLength()
        if costs is not None:
            policy.calibrate(costs)
        return policy


class DraftLength:
    """The handle described in the module docstring; implements ``DraftPolicy``."""

    def __init__(self, setting: PolicySetting) -> None:
        self._lock = threading.Lock()
        self._inner = setting.policy()
        self._from_config = True  # False once the user picked K another way
        self._loaded = False  # a pair of models was loaded before

    # -- DraftPolicy: the policy in force answers ----------------------------------------------

    @property
    def _policy(self) -> DraftPolicy:
        with self._lock:
            return self._inner

    @property
    def adaptive(self) -> bool:
        return self._policy.adaptive

    def current_k(self) -> int:
        return self._policy.current_k()

    def budget(self) -> DraftBudget:
        return self._policy.budget()

    def observe(self, outcome: StepOutcome) -> None:
        self._policy.observe(outcome)

    def start_turn(self) -> None:
        self._policy.start_turn()

    # -- what the front ends and the configuration change -------------------------------------

    def models_loaded(self, setting: PolicySetting) -> None:
        """The models of ``setting.setup`` are loaded: a policy that follows the configuration
        is made afresh for another pair, and an adaptive one starts from what this setup
        measured."""
        with self._lock:
            if self._from_config:
                if self._loaded:
                    self._inner = setting.policy()
                _recall(self._inner, setting.setup)
            self._loaded = True

    def configure(self, setting: PolicySetting, loaded: bool) -> None:
        """Draft as ``setting`` says from the next step. ``loaded``: models are loaded (an
        adaptive policy then starts from their measurements, and K no longer follows the
        configuration when another pair is loaded)."""
        policy = setting.policy()
        if loaded:
            _recall(policy, setting.setup)
        with self._lock:
            self._inner = policy
            self._from_config = not loaded

    def set(self, k: int) -> int:
        """Draft ``k`` tokens (clamped to 0..MAX_DRAFT_LENGTH) from the next step: a fixed K is
        set in place, an adaptive policy is replaced by a fixed K. Returns the K now in force."""
        with self._lock:
            if isinstance(self._inner, FixedDraftLength):
                return self._inner.set(k)
            return self._fix(k)

    def adjust(self, delta: int, current: int | None = None) -> int:
        """Raise or lower K by ``delta``; returns the K now in force. A fixed K is adjusted in
        place; an adaptive policy becomes a fixed K from ``current`` (the K of the latest step, if
        any), else from its own choice of the moment."""
        with self._lock:
            inner = self._inner
            if isinstance(inner, FixedDraftLength):
                return inner.adjust(delta)
            start = current if current is not None else inner.current_k()
            return self._fix(start + delta)

    def remember(self, setting: PolicySetting) -> None:
        """Keep what an adaptive policy measured for the next run with ``setting.setup``."""
        policy = self._policy
        if isinstance(policy, AutoDraftLength):
            remember(policy, memory_path(setting.setup))

    def _fix(self, k: int) -> int:
        """(Lock held.) A fixed K from now on, chosen by the user: it stays."""
        self._inner = FixedDraftLength(min(max(k, 0), MAX_DRAFT_LENGTH))
        self._from_config = False
        return self._inner.k


def _recall(policy: DraftPolicy, setup: Sequence[str]) -> None:
    """An adaptive policy starts from what the last run with ``setup`` measured."""
    if isinstance(policy, AutoDraftLength):
        recall(policy, memory_path(setup))
