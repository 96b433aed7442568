"""The free draft sources as one shape, and the order the default drafter tries them in.

A free source costs no model call: the predicted output (``chatapp.drafters.prediction``), the
speculative edits (``chatapp.drafters.edits``), the history-wide suffix index
(``chatapp.drafters.suffix``) and the n-gram lookup (``chatapp.drafters.lookup``). Each is a
``Source``: it is fed every token of the context, in order (``append``), and proposes a
continuation of the context (``propose``) as a ``Candidate``, one-hot, under a kind of its own
family, so that the engine verifies every proposal exactly and the policy learns each kind apart.

``ranked`` is the one place that decides which source drafts: the drafter takes the first ranked
candidate whose kind the policy gives a budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from chatapp.drafters.edits import EDIT_RUN
from chatapp.drafters.suffix_index import SUFFIX_LONG

# How confident an edit cursor's proposal is, by its kind after the family ("run-long": a long
# run since its last re-join); other kinds ("step": a guess after a divergence) rank 0.
_CONFIDENCE = {"run-long": 3, "run": 2, "line": 1, "new": 1}


@dataclass(frozen=True)
class Candidate:
    """A source's proposal: ``tokens`` (empty: it proposes nothing) of ``kind``; ``also``: the
    kinds of other sources that propose the same tokens (the drafter budgets the candidate under
    whichever of its ``kinds`` the policy trusts with the most tokens)."""

    tokens: list[int]
    kind: str
    also: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind, *self.also)


NOTHING = Candidate([], "")


class Source(Protocol):
    """A free draft source; see the module docstring."""

    def append(self, token: int) -> None:
        """The context grew by ``token``."""
        ...

    def propose(self, context: Sequence[int], k: int) -> Candidate:
        """Up to ``k`` tokens continuing ``context`` (every token appended so far)."""
        ...


def ranked(prediction: Candidate, edit: Candidate, suffix: Candidate,
           lookup: Candidate) -> list[Candidate]:
    """The candidates that propose something, in the order the drafter tries them:

    1. Where the prediction proposes what the edits do (``agree``: the prompt quotes the
       predicted code, which the edits follow too), the two are one candidate under both kinds,
       the longer of the two proposals.
    2. Else the prediction comes first when the edits propose nothing or its cursor is the more
       confident (``ahead_of_edits``).
    3. Then the suffix index and the edits: a "suffix-long" continuation (an earlier chat's text
       being written again) before the edits unless they are in a confident run, else the edits
       first.
    4. Then the prediction, if it did not come first.
    5. The n-gram lookup last.
    """
    if agree(prediction.tokens, edit.tokens):
        edit = Candidate(max(edit.tokens, prediction.tokens, key=len), edit.kind,
                         (*edit.also, *prediction.kinds))
        prediction = NOTHING
    early = bool(prediction.tokens) and ahead_of_edits(
        prediction.kind, edit.kind if edit.tokens else "")
    suffix_first = suffix.kind == SUFFIX_LONG and not edit.kind.startswith(EDIT_RUN)
    order = [prediction] if early else []
    order += [suffix, edit] if suffix_first else [edit, suffix]
    order += [] if early else [prediction]
    return [candidate for candidate in [*order, lookup] if candidate.tokens]


def agree(predicted: Sequence[int], edit: Sequence[int]) -> bool:
    """Whether the prediction's proposal ``predicted`` and the speculative edits' ``edit`` are the
    same continuation: neither is empty and one is a prefix of the other."""
    n = min(len(predicted), len(edit))
    return n > 0 and list(predicted[:n]) == list(edit[:n])


def ahead_of_edits(predicted: str, edit: str) -> bool:
    """Whether the prediction's proposal of kind ``predicted`` goes before the speculative edits'
    of kind ``edit`` ("": they propose nothing): when they propose nothing, or the prediction's
    cursor is the more confident; on a tie the edits, whose cursor follows the context itself."""
    return not edit or _confidence(predicted) > _confidence(edit)


def _confidence(kind: str) -> int:
    return _CONFIDENCE.get(kind.partition("-")[2], 0)
