"""The edit tracker (``chatapp.drafters.edits.EditTracker``) on its own as a ``Drafter``, for tests
and comparisons; the default drafter uses the tracker through ``NgramDrafter``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatapp.drafters.edits import EDIT_KIND, EditTracker
from chatapp.engine.contracts import DraftBudget, DraftHints, Proposal, ShadowScore
from chatapp.engine.sampling import SamplingParams


class EditDrafter:
    """The edit tracker on its own as a ``Drafter`` ("edit"), for tests and comparisons; the
    default drafter uses it through ``NgramDrafter``."""

    def __init__(self, vocab_size: int, **tracker_options: int) -> None:
        self.vocab_size = vocab_size
        self._options = tracker_options
        self.tracker = EditTracker(**tracker_options)

    @property
    def name(self) -> str:
        return EDIT_KIND

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        self.sync(context)
        self.tracker.start_reply()

    def score_emitted(self, context: Sequence[int]) -> tuple[ShadowScore, ...]:
        """Feed ``context``; no scores (on its own, the tracker drafts at the budget's K)."""
        self.sync(context)
        return ()

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Nothing: the tracker holds emitted tokens only, never drafts."""

    def sync(self, context: Sequence[int]) -> None:
        """Feed the tokens of ``context`` not seen yet (start over if it is not an extension)."""
        tracker = self.tracker
        known = len(tracker)
        if len(context) < known or list(context[:known]) != tracker.tokens:
            self.tracker = tracker = EditTracker(**self._options)
            known = 0
        for token in context[known:]:
            tracker.append(token)

    def close(self) -> None:
        """Nothing to free: no model."""

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.sync(context)
        tokens, kind = self.tracker.propose(budget.most)
        tokens = tokens[:budget.for_source(kind)]
        if not tokens:
            return Proposal.empty(self.vocab_size)
        return Proposal.one_hot(tokens, self.vocab_size, kind)
