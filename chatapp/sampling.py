"""Logits to probabilities, and sampling with an explicit random generator.

Contract: ``probabilities(logits, params)`` is the single function that turns model logits into
the distribution a token is drawn from. The draft and the target both go through it with the same
``SamplingParams``, so the ratio p(x)/q(x) used by the verifier compares like with like.

At temperature 0 the distribution is one-hot on the argmax (ties go to the lowest id), which turns
exact rejection sampling into "accept while the draft equals the target's argmax".
Pure functions: no model, no I/O, no global random state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Candidates examined before falling back to a full sort for top-p; covers typical nucleus sizes.
_TOP_P_CANDIDATES = 2048
# Rounding slack when comparing a cumulative mass with top_p (0.5 + 0.3 must reach 0.8).
_MASS_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. ``top_k`` 0 and ``top_p`` 1.0 mean "off"."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Return float64 probabilities with the shape of ``logits`` ((V,) or (n, V)); rows sum to 1."""
    logits = np.asarray(logits)
    if logits.ndim == 2:
        return np.stack([probabilities(row, params) for row in logits]) if len(logits) else (
            np.zeros(logits.shape, dtype=np.float64))
    if params.greedy:
        return one_hot(int(np.argmax(logits)), logits.shape[-1])
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - np.max(scaled))
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def one_hot(token: int, vocab_size: int) -> np.ndarray:
    """A distribution with all its mass on ``token``."""
    probs = np.zeros(vocab_size, dtype=np.float64)
    probs[token] = 1.0
    return probs


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise."""
    n = min(_TOP_P_CANDIDATES, probs.shape[-1])
    candidates = np.argpartition(probs, -n)[-n:] if n < probs.shape[-1] else np.arange(n)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    if cumulative[-1] < top_p and n < probs.shape[-1]:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
    keep = order[: int(np.searchsorted(cumulative, top_p - _MASS_TOLERANCE)) + 1]
    nucleus = np.zeros_like(probs)
    nucleus[keep] = probs[keep]
    return nucleus / nucleus.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from ``probs`` (1-D, non-negative, positive sum) by inverse CDF."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    index = int(np.searchsorted(cumulative, u, side="right"))
    return min(index, len(probs) - 1)
