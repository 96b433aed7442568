"""Keeping a backend's KV cache in step with a token sequence: reuse the longest cached prefix,
roll back what diverges (rejected drafts, an edited conversation)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from chatapp.backends.base import Backend


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


def evaluate_in_chunks(backend: Backend, sequence: Sequence[int], chunk: int
                       ) -> Iterator[tuple[int, int]]:
    """Make ``backend``'s cache hold ``sequence``, reusing its longest cached prefix and
    evaluating the rest ``chunk`` tokens at a time (no logits); after each chunk, yield how many
    of the tokens to evaluate are done and how many there are. A caller that stops iterating
    leaves the cache holding a prefix of ``sequence``."""
    rollback_to_prefix(backend, sequence)
    start = len(backend.cached_tokens)
    total = len(sequence) - start
    for done in range(0, total, chunk):
        backend.evaluate(sequence[start + done:start + done + chunk], 0)
        yield min(done + chunk, total), total
