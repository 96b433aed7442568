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

# Probability floors tried in turn when looking for the top-p nucleus (0: every token). Tokens
# under a floor are never sorted unless the tokens above it hold less than top_p of the mass.
_NUCLEUS_FLOORS = (1e-4, 1e-7, 0.0)
# Rounding slack when comparing a cumulative mass with top_p (0.5 + 0.3 must reach 0.8).
_MASS_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution: the tempered softmax, cut to the ``top_k`` most likely
    tokens, then to the ``top_p`` nucleus, then to the tokens whose probability is at least
    ``min_p`` times the most likely one's, renormalised after each cut. ``top_k`` 0, ``top_p``
    1.0 and ``min_p`` 0.0 mean "off"."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Return float64 probabilities with the shape of ``logits`` ((V,) or (n, V)); rows sum to 1."""
    logits = np.asarray(logits)
    out = np.empty(logits.shape, dtype=np.float64)
    if logits.size:
        vocab_size = logits.shape[-1]
        for values, row in zip(logits.reshape(-1, vocab_size), out.reshape(-1, vocab_size)):
            _fill_row(values, params, row)
    return out


def greedy_tokens(logits: np.ndarray) -> list[int]:
    """The token each row of ``logits`` ((n, V)) puts all its mass on at temperature 0: the
    argmax, ties to the lowest id, exactly where ``probabilities`` puts its one-hot mass. The
    greedy path uses it instead of building and sampling 152k-wide one-hot rows per token."""
    return [int(i) for i in np.argmax(np.asarray(logits).reshape(-1, logits.shape[-1]), axis=1)]


def _fill_row(logits: np.ndarray, params: SamplingParams, out: np.ndarray) -> None:
    """Write the distribution of one row of logits into ``out`` (float64, same length).

    Works in place on ``out`` and, with top-k, exponentiates only the k kept logits: this runs
    for every drafted and verified position over a vocabulary of up to 152k tokens.
    """
    if params.greedy:
        out.fill(0.0)
        out[int(np.argmax(logits))] = 1.0
        return
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = np.partition(logits, -params.top_k)[-params.top_k]
        kept = np.flatnonzero(logits >= kth)
        weights = _softmax(logits[kept], params.temperature)
        if params.top_p < 1.0:
            _keep_nucleus(weights, params.top_p)
        if params.min_p > 0.0:
            _keep_above_min_p(weights, params.min_p)
        out.fill(0.0)
        out[kept] = weights
        return
    np.subtract(logits, np.max(logits), out=out, dtype=np.float64)
    out *= 1.0 / params.temperature
    np.exp(out, out=out)
    out /= out.sum()
    if params.top_p < 1.0:
        _keep_nucleus(out, params.top_p)
    if params.min_p > 0.0:
        _keep_above_min_p(out, params.min_p)


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    scaled = (logits.astype(np.float64) - np.max(logits)) / temperature
    weights = np.exp(scaled)
    return weights / weights.sum()


def _keep_nucleus(probs: np.ndarray, top_p: float) -> None:
    """In place: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (ties:
    lowest id first), zero the rest, renormalise. Only the tokens above a probability floor are
    sorted; the floor is lowered until the tokens above it hold the nucleus."""
    for floor in _NUCLEUS_FLOORS:
        candidates = np.flatnonzero(probs >= floor) if floor > 0.0 else np.arange(len(probs))
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order])
        if len(cumulative) and cumulative[-1] >= top_p - _MASS_TOLERANCE:
            break
    size = min(int(np.searchsorted(cumulative, top_p - _MASS_TOLERANCE)) + 1, len(order))
    keep = order[:size]
    kept = probs[keep] / cumulative[size - 1]
    probs.fill(0.0)
    probs[keep] = kept


def _keep_above_min_p(probs: np.ndarray, min_p: float) -> None:
    """In place: zero the tokens under ``min_p`` times the largest probability, renormalise
    (the most likely token always stays)."""
    probs[probs < min_p * np.max(probs)] = 0.0
    probs /= probs.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from ``probs`` (1-D, non-negative, positive sum) by inverse CDF."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    index = int(np.searchsorted(cumulative, u, side="right"))
    return min(index, len(probs) - 1)
