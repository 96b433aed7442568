"""The K handle (chatapp.policy.draft_length), without a conversation: the swap between a fixed K
and auto, the from-config rule, and what auto remembers per setup."""

from __future__ import annotations

from pathlib import Path

from chatapp.engine.contracts import MAX_DRAFT_LENGTH, StepOutcome
from chatapp.policy.draft_length import DraftLength, PolicySetting
from chatapp.policy.measurements import memory_path

AUTO = PolicySetting(None, ("machine", "pair A"))
OTHER_PAIR = PolicySetting(None, ("machine", "pair B"))


def test_a_picked_k_replaces_auto_and_outlives_another_pair() -> None:
    k = DraftLength(AUTO)
    k.models_loaded(AUTO)
    assert k.adaptive
    assert k.adjust(-1, current=4) == 3 and not k.adaptive  # from the latest step's K
    k.models_loaded(OTHER_PAIR)
    assert not k.adaptive and k.current_k() == 3  # the user's choice stays
    assert k.set(99) == MAX_DRAFT_LENGTH and k.budget().most == MAX_DRAFT_LENGTH
    k.configure(AUTO, loaded=True)
    assert k.adaptive


def test_k_from_the_configuration_is_made_afresh_for_another_pair() -> None:
    k = DraftLength(PolicySetting(3))
    k.models_loaded(PolicySetting(3))
    k.models_loaded(PolicySetting(5))
    assert k.current_k() == 5 and not k.adaptive


def test_auto_remembers_per_setup_and_starts_from_it(private_state_dir: Path) -> None:
    k = DraftLength(AUTO)
    k.models_loaded(AUTO)
    for _ in range(50):
        k.observe(StepOutcome("model", 4, 4, 0.001, 0.01))
    k.remember(AUTO)
    assert memory_path(AUTO.setup).is_file() and not memory_path(OTHER_PAIR.setup).exists()
    fresh = DraftLength(AUTO).current_k()
    again = DraftLength(AUTO)
    again.models_loaded(AUTO)
    assert again.current_k() == k.current_k() != fresh  # it starts from what was measured
    saved = memory_path(AUTO.setup).read_text()
    k.set(2)
    k.remember(AUTO)  # a fixed K has nothing to remember: the file is left as it was
    assert memory_path(AUTO.setup).read_text() == saved
