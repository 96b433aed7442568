"""The draft model as a drafter: tokens sampled autoregressively from a small model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatapp.backends.base import Backend
from chatapp.engine.contracts import (
    MODEL_SOURCE,
    DraftBudget,
    DraftHints,
    Proposal,
    ShadowScore,
)
from chatapp.engine.kv import evaluate_sequence, rollback_to_prefix
from chatapp.engine.sampling import SamplingParams, greedy_tokens, probabilities, sample


class ModelDrafter:
    """Drafts autoregressively with a small model, sampling with the same params as the target.

    Its source is ``MODEL_SOURCE``. With ``deferred``, ``prefill`` evaluates nothing: the draft
    model catches up on the first proposal (``evaluate_sequence`` feeds what it lacks in one
    batch), so when the policy never drafts, the draft model never evaluates the prompt. Its
    cache still never holds tokens that are not in the conversation: ``prefill`` drops whatever
    the new context no longer shares (a new chat, an edited message).
    """

    def __init__(self, backend: Backend, deferred: bool = False) -> None:
        self.backend = backend
        self.deferred = deferred

    @property
    def name(self) -> str:
        return self.backend.name

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        if self.deferred:
            rollback_to_prefix(self.backend, context)
        else:
            evaluate_sequence(self.backend, context, 0)

    def score_emitted(self, context: Sequence[int]) -> tuple[ShadowScore, ...]:
        """Nothing: the draft model does not score itself (it catches up when it drafts)."""
        return ()

    def rollback(self, context: Sequence[int], verified: int) -> None:
        rollback_to_prefix(self.backend, context, verified)

    def close(self) -> None:
        self.backend.close()

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        return self.draft(context, budget.for_source(MODEL_SOURCE), params, rng)

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> Proposal:
        """Up to ``k`` tokens sampled from the draft model (fewer when it proposes a stop).

        The first token brings the cache in step with ``context`` (``evaluate_sequence``: what it
        lacks is fed in one batch); the cache then holds ``context`` plus the tokens drafted but
        the last, so each later token is fed alone, without reading the cache back."""
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for _ in range(k):
            logits = (self.backend.evaluate(tokens[-1:], 1) if tokens
                      else evaluate_sequence(self.backend, context, 1))
            if params.greedy:  # a one-hot row, left unbuilt: greedy verification never reads it
                token = greedy_tokens(logits)[0]
            else:
                rows.append(probabilities(logits[0], params))
                token = sample(rows[-1], rng)
            tokens.append(token)
            if token in self.backend.stop_ids:
                break
        if params.greedy or not tokens:
            return Proposal.one_hot(tokens, self.backend.vocab_size, MODEL_SOURCE)
        return Proposal(tokens, np.stack(rows), MODEL_SOURCE)
