"""Which local models can draft for which: the same vocabulary, and much smaller.

A draft must tokenise exactly as its target does (the same ``vocab_fingerprint``: token list and
special ids), else its tokens cannot be verified; and it must be at most about a third of the
target's size (``MAX_DRAFT_SHARE`` of its parameters), else drafting costs about what it saves.
Among the drafts that fit, the best is of the target's family, then in the target's store, then
the largest (a larger draft is accepted more often).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from chatapp.model_stores.gguf_facts import GgufFacts, UnreadableModelError, model_facts
from chatapp.model_stores.stores import FoundModel

MAX_DRAFT_SHARE = 0.4  # "about a third" of the target's parameters, with room for rounding


@dataclass(frozen=True)
class Surveyed:
    """A model with the facts of its file."""

    model: FoundModel
    facts: GgufFacts


def survey(models: Iterable[FoundModel]) -> tuple[list[Surveyed], list[str]]:
    """The facts of every model (cached, ``model_facts``), and one line per model that cannot be
    read or has no chat template (those without a template are kept; unreadable ones are not)."""
    surveyed, problems = [], []
    for model in models:
        try:
            facts = model_facts(model.path)
        except UnreadableModelError as error:
            problems.append(f"{model.name}: {error}")
            continue
        except OSError as error:
            problems.append(f"{model.name}: cannot read {model.path}: {error.strerror or error}")
            continue
        if not facts.chat_template:
            problems.append(f"{model.name}: the file has no chat template; specchat formats "
                            "its chats as ChatML, which this model may not follow")
        surveyed.append(Surveyed(model, facts))
    return surveyed, problems


def can_draft(draft: GgufFacts, target: GgufFacts) -> bool:
    """Whether ``draft`` can draft for ``target``: the same vocabulary, much smaller."""
    return (draft.vocab_fingerprint == target.vocab_fingerprint
            and draft.parameters <= target.parameters * MAX_DRAFT_SHARE)


def drafts_for(target: Surveyed, candidates: Iterable[Surveyed]) -> list[Surveyed]:
    """The ``candidates`` that can draft for ``target``, the best first."""
    fitting = [c for c in candidates if c.model.path != target.model.path
               and can_draft(c.facts, target.facts)]
    return sorted(fitting, key=lambda c: (c.facts.family != target.facts.family,
                                          c.model.store != target.model.store,
                                          -c.facts.parameters, c.model.name))
