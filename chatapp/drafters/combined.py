"""The default drafter, "ngram+model": the free sources' proposal (speculative edits, the suffix
index, prompt lookup: ``chatapp.drafters.lookup``) when there is one, else the draft model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import (
    MODEL_SOURCE,
    DraftBudget,
    DraftHints,
    Proposal,
    ShadowScore,
)
from chatapp.engine.sampling import SamplingParams


class NgramModelDrafter:
    """"ngram+model": the n-gram proposal when there is one, else the draft model.

    Each source drafts within its own budget, which may be 0; the model drafts when the n-gram
    proposes nothing. With ``fill``, an n-gram proposal shorter than the largest budget is topped
    up by the model, drafting after the n-gram tokens.
    """

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, fill: bool = False) -> None:
        self.ngram = ngram
        self.model = model
        self.fill = fill

    @property
    def name(self) -> str:
        return f"ngram+{self.model.name}"

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        self.ngram.prefill(context, hints)
        self.model.prefill(context, hints)

    def score_emitted(self, context: Sequence[int]) -> tuple[ShadowScore, ...]:
        return self.ngram.score_emitted(context)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        self.model.rollback(context, verified)

    def close(self) -> None:
        self.model.close()

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.ngram.sync(context, score=True)
        proposal = self.ngram.proposal(self.ngram.choose(budget))
        if proposal.tokens:
            return self._filled(context, proposal, budget.most, params, rng)
        return self.model.draft(context, budget.for_source(MODEL_SOURCE), params, rng)

    def _filled(self, context: Sequence[int], proposal: Proposal, k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """With ``fill``, ``proposal`` topped up to ``k`` tokens by the model."""
        tokens = proposal.tokens
        if not self.fill or len(tokens) >= k or tokens[-1] in self.model.backend.stop_ids:
            return proposal
        more = self.model.draft(list(context) + tokens, k - len(tokens), params, rng)
        return Proposal(tokens + more.tokens, np.concatenate([proposal.probs, more.probs]),
                        proposal.source)

