"""Draft proposals, and keeping a backend's KV cache in step with a token sequence.

A ``Proposal`` keeps what was proposed together with the distributions it was drawn from, so the
verifier always divides by the q that actually produced each token (a greedy or n-gram drafter
proposes with a one-hot q).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from chatapp.backends.base import Backend
from chatapp.sampling import SamplingParams, probabilities, sample


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray  # (len(tokens), V): row i is the distribution tokens[i] was drawn from

    @classmethod
    def empty(cls, vocab_size: int) -> "Proposal":
        return cls([], np.zeros((0, vocab_size)))


def one_hot_rows(tokens: Sequence[int], vocab_size: int) -> np.ndarray:
    """(len(tokens), vocab_size) float64, row i one-hot on tokens[i]: the distributions of a
    deterministic proposal (n-gram lookup, speculative edits)."""
    rows = np.zeros((len(tokens), vocab_size), dtype=np.float64)
    if len(tokens):
        rows[np.arange(len(tokens)), np.asarray(tokens, dtype=np.intp)] = 1.0
    return rows


class Drafter(Protocol):
    """Proposes up to ``k`` tokens that follow ``context``."""

    @property
    def name(self) -> str: ...

    def prefill(self, context: Sequence[int]) -> None:
        """Bring any cache up to ``context`` ahead of the first proposal (may do nothing)."""
        ...

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal: ...

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Forget any cached state past the longest prefix shared with ``context``.

        The first ``verified`` tokens of ``context`` are known to match what is cached.
        """
        ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (the whole-prefix case at C speed)."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def rollback_to_prefix(backend: Backend, sequence: Sequence[int], verified: int = 0) -> None:
    """Truncate ``backend``'s cache to its longest prefix shared with ``sequence``.

    Positions below ``verified`` are trusted to match and are not compared.
    """
    cached = backend.cached_tokens
    start = min(verified, len(cached), len(sequence))
    keep = start + common_prefix_length(cached[start:], sequence[start:])
    if keep < len(cached):
        backend.truncate(keep)


def evaluate_sequence(backend: Backend, sequence: Sequence[int], n_logits: int) -> np.ndarray:
    """Make ``backend``'s cache hold ``sequence`` and return logits after its last ``n_logits``.

    Reuses the longest cached prefix; rolls back whatever diverges (rejected drafts, an edited
    conversation). At least ``n_logits`` tokens are re-fed so their logits can be produced.
    """
    cached = backend.cached_tokens
    keep = min(common_prefix_length(cached, sequence), len(sequence) - n_logits)
    if keep < len(cached):
        backend.truncate(keep)
    fresh = list(sequence[keep:])
    if not fresh:
        return np.zeros((0, backend.vocab_size), dtype=np.float32)
    return backend.evaluate(fresh, n_logits)


class ModelDrafter:
    """Drafts autoregressively with a small model, sampling with the same params as the target."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def name(self) -> str:
        return self.backend.name

    def prefill(self, context: Sequence[int]) -> None:
        evaluate_sequence(self.backend, context, 0)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        rollback_to_prefix(self.backend, context, verified)

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        sequence = list(context)
        for _ in range(k):
            q = probabilities(evaluate_sequence(self.backend, sequence, 1)[0], params)
            token = sample(q, rng)
            tokens.append(token)
            rows.append(q)
            sequence.append(token)
            if token in self.backend.stop_ids:
                break
        if not tokens:
            return Proposal.empty(self.backend.vocab_size)
        return Proposal(tokens, np.stack(rows))
