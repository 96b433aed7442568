"""Exact verification of drafted tokens (speculative sampling, Leviathan et al. / Chen et al. 2023).

Contract of ``verify``: given K drafted tokens, the distributions q_i they were *actually* drawn
from, and the target's distributions p_0..p_K at the same positions plus the one after, accept
draft i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the replacement
from norm(max(0, p_i - q_i)); if all K are accepted draw a bonus token from p_K, or, when the draft
was cut before a token x_K that p_K refuses (p_K(x_K) = 0: a grammar's mask), from
norm(max(0, p_K - q_K)) with the q_K that x_K was drawn from (``refused``), as verifying x_K would
have. Every token that results follows the target's distribution exactly, whatever q is (one-hot
greedy or n-gram proposals included). Pure: no model, no I/O; randomness only from the generator
passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatapp.engine.sampling import sample


def verify(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray,
    target_probs: np.ndarray,
    rng: np.random.Generator,
    refused: np.ndarray | None = None,
) -> tuple[int, int]:
    """Return ``(n_accepted, next_token)``; see the module docstring.

    ``draft_probs`` has shape (K, V); ``target_probs`` has shape (K+1, V). K may be 0.
    ``refused`` (V,): the distribution of a drafted token after the K that was cut off because
    the target's law gives it no mass; None: there was none.
    """
    k = len(draft_tokens)
    if target_probs.shape[0] != k + 1 or (k and draft_probs.shape[0] != k):
        raise ValueError(
            f"shape mismatch: {k} drafts, draft_probs {draft_probs.shape}, "
            f"target_probs {target_probs.shape}"
        )
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if _accepts(p[token], q[token], rng):
            continue
        return i, sample(_residual(p, q), rng)
    last = target_probs[k]
    return k, sample(last if refused is None else _residual(last, refused), rng)


def verify_greedy(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> tuple[int, int]:
    """``verify`` at temperature 0, from the target's greedy tokens at the K + 1 positions
    (``sampling.greedy_tokens``). There p_i is one-hot on t_i = target_tokens[i], so whatever
    q_i is, x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)) = [x_i == t_i], the
    residual of a rejection, max(0, p_i - q_i), has its mass on t_i alone, and the bonus token is
    t_K. Same result as ``verify`` (which draws random numbers nothing then depends on), with no
    rows of the vocabulary's width."""
    k = len(draft_tokens)
    if len(target_tokens) != k + 1:
        raise ValueError(f"shape mismatch: {k} drafts, {len(target_tokens)} target tokens")
    for i, token in enumerate(draft_tokens):
        if token != target_tokens[i]:
            return i, target_tokens[i]
    return k, target_tokens[k]


def _accepts(p_x: float, q_x: float, rng: np.random.Generator) -> bool:
    """Accept with probability min(1, p_x / q_x); a token the draft could not draw is rejected."""
    if q_x <= 0.0:
        return False
    if p_x >= q_x:
        return True
    return bool(rng.random() < p_x / q_x)


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)); falls back to p when the difference has no mass (p == q up to
    rounding)."""
    residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:
        return p
    return residual
