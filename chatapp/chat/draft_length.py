"""The draft length K of a conversation: the policy it hands the engine, which the user changes
while replies stream, and whether that policy still follows the configuration.

``DraftLength.policy`` is the ``SwitchablePolicy`` every turn of the conversation drafts with, the
same object for good: a K the user picks (keys, the command palette) or a new configuration
replaces what stands behind it from the engine's next step. While the policy follows the
configuration, another pair of models starts it afresh; once the user picked K another way, that
choice stays. An adaptive policy starts from what the last run with the same setup measured once
the models are loaded, and keeps its measurements after every reply (``chatapp.policy.memory``).
"""

from __future__ import annotations

from chatapp.chat.loader import make_policy
from chatapp.chat.turns import k_label
from chatapp.engine.contracts import DraftPolicy
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import SwitchablePolicy
from chatapp.policy.memory import memory_path, recall, remember
from chatapp.settings.config import Config


class DraftLength:
    """The policy of one conversation and where it comes from (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.policy = SwitchablePolicy(make_policy(config))
        self._from_config = True  # False once the user picked K another way
        self._loaded = False  # a pair of models was loaded before

    @property
    def label(self) -> str:
        """The draft length in force, as the front ends show it ("3", "auto(4)")."""
        return k_label(self.policy.current_k(), self.policy.adaptive)

    def models_loaded(self, config: Config) -> None:
        """``config``'s models are loaded: a policy that follows the configuration is made
        afresh for another pair, and an adaptive one starts from what this pair measured."""
        if self._from_config:
            if self._loaded:
                self.policy.replace(make_policy(config))
            _recall(self.policy.inner, config)
        self._loaded = True

    def adjust(self, delta: int, current: int | None) -> int:
        """K + ``delta``, an adaptive policy becoming a fixed K from ``current`` (the K of the
        latest step, if any); returns the K now in force."""
        before = self.policy.inner
        k = self.policy.adjust(delta, current)
        if self.policy.inner is not before:
            self._from_config = False
        return k

    def set(self, k: int) -> None:
        """A fixed K from the next step."""
        before = self.policy.inner
        self.policy.set(k)
        if self.policy.inner is not before:
            self._from_config = False

    def configure(self, config: Config, loaded: bool) -> None:
        """Draft as ``config`` says from the next step. ``loaded``: models are loaded (an
        adaptive policy then starts from their measurements, and the policy no longer follows
        the configuration when another pair is loaded)."""
        policy = make_policy(config)
        if loaded:
            _recall(policy, config)
        self.policy.replace(policy)
        self._from_config = not loaded

    def remember(self, config: Config) -> None:
        """Keep what an adaptive policy measured for the next run with ``config``'s setup."""
        if isinstance(self.policy.inner, AutoDraftLength):
            remember(self.policy.inner, memory_path(config.measured_setup()))


def _recall(policy: DraftPolicy, config: Config) -> None:
    """An adaptive policy starts from what the last run with ``config``'s setup measured."""
    if isinstance(policy, AutoDraftLength):
        recall(policy, memory_path(config.measured_setup()))
