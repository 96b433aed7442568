"""Exactness of ``verify``: every emitted token follows the target distribution, whatever q is."""

from __future__ import annotations

import numpy as np
import pytest

from chatapp.engine.contracts import one_hot_rows
from chatapp.engine.sampling import SamplingParams, greedy_tokens, probabilities, sample
from chatapp.engine.verify import verify, verify_greedy
from tests.stat_tools import fits

V = 6
TRIALS = 8000


def _emitted_tokens(p_rows: np.ndarray, q_rows: np.ndarray, seed: int, trials: int = TRIALS,
                    draft_from: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run draft-then-verify ``trials`` times; count the first and the second emitted tokens.

    Drafts are drawn from ``draft_from`` (default: ``q_rows``, the honest case). Second tokens
    are counted only when the first was an accepted draft (so both come from one step).
    """
    rng = np.random.default_rng(seed)
    draw_rows = q_rows if draft_from is None else draft_from
    first, second = np.zeros(V), np.zeros(V)
    for _ in range(trials):
        drafts = [sample(row, rng) for row in draw_rows]
        n, nxt = verify(drafts, q_rows, p_rows, rng)
        emitted = drafts[:n] + [nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


def _random_pair(rng: np.random.Generator, sparse: bool) -> tuple[np.ndarray, np.ndarray]:
    p = rng.dirichlet(np.full(V, 0.7))
    q = rng.dirichlet(np.full(V, 0.7))
    if sparse:  # the draft gives no mass to tokens the target likes, and vice versa
        q[np.argmax(p)] = 0.0
        q /= q.sum()
        p[np.argmax(q)] = 0.0
        p /= p.sum()
    return p, q


@pytest.mark.parametrize("seed", range(12))
def test_first_and_second_tokens_follow_target_for_random_pairs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pairs = [_random_pair(rng, sparse=seed % 2 == 1) for _ in range(3)]
    p_rows = np.stack([pairs[0][0], pairs[1][0], pairs[2][0]])  # K = 2 drafts + bonus row
    q_rows = np.stack([pairs[0][1], pairs[1][1]])
    first, second = _emitted_tokens(p_rows, q_rows, seed)
    assert fits(first, p_rows[0])
    assert fits(second, p_rows[1])


def test_one_hot_greedy_drafts_are_exact() -> None:
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(V), size=2)
    q = one_hot_rows([int(np.argmax(rng.random(V)))], V)
    first, _ = _emitted_tokens(p, q, seed=1)
    assert fits(first, p[0])


def test_identical_p_and_q_accepts_everything() -> None:
    p = np.random.default_rng(3).dirichlet(np.ones(V), size=4)
    rng = np.random.default_rng(0)
    for _ in range(200):
        drafts = [sample(row, rng) for row in p[:3]]
        n, _ = verify(drafts, p[:3], p, rng)
        assert n == 3


def test_draft_token_the_target_cannot_emit_is_always_rejected() -> None:
    p = np.array([[0.0, 0.5, 0.5, 0, 0, 0], [1 / 6] * 6])
    q = np.array([[1.0, 0, 0, 0, 0, 0]])
    rng = np.random.default_rng(0)
    for _ in range(100):
        n, nxt = verify([0], q, p, rng)
        assert n == 0 and nxt in (1, 2)


def test_greedy_accepts_while_draft_equals_target_argmax() -> None:
    target = [3, 1, 4, 5]
    p = one_hot_rows(target, V)
    rng = np.random.default_rng(0)
    assert verify([3, 1, 4], one_hot_rows((3, 1, 4), V), p, rng) == (3, 5)
    assert verify([3, 2, 4], one_hot_rows((3, 2, 4), V), p, rng) == (1, 1)
    assert verify([0, 1, 4], one_hot_rows((0, 1, 4), V), p, rng) == (0, 3)


def test_k_zero_samples_from_the_target() -> None:
    p = np.random.default_rng(5).dirichlet(np.ones(V), size=1)
    first, _ = _emitted_tokens(p, np.zeros((0, V)), seed=2)
    assert fits(first, p[0])


def test_the_check_detects_a_verifier_given_the_wrong_q() -> None:
    """The common public bug: drafts picked greedily, ratio computed with the full softmax q.

    The same goodness-of-fit check that passes above must reject this, or it proves nothing.
    """
    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.ones(V), size=2)
    q_soft = rng.dirichlet(np.ones(V), size=1)
    greedy_rows = one_hot_rows([int(np.argmax(q_soft[0]))], V)
    first, _ = _emitted_tokens(p, q_soft, seed=4, draft_from=greedy_rows)
    assert not fits(first, p[0])


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError):
        verify([1, 2], np.zeros((2, V)), np.zeros((2, V)), np.random.default_rng(0))


@pytest.mark.parametrize("seed", range(20))
def test_greedy_verification_gives_what_verify_gives_at_temperature_zero(seed: int) -> None:
    # Logits with ties (rounded to one decimal) and drafts that match the argmax for a while,
    # from any q: verify on probabilities' one-hot rows and verify_greedy on the argmax tokens
    # must agree on the accepted count and the next token.
    rng = np.random.default_rng(seed)
    k = int(rng.integers(0, 6))
    logits = np.round(rng.normal(size=(k + 1, V)), 1).astype(np.float32)
    target = greedy_tokens(logits)
    cut = int(rng.integers(0, k + 1))
    drafts = target[:cut] + [int(t) for t in rng.integers(0, V, size=k - cut)]
    q_rows = rng.dirichlet(np.ones(V), size=k) if k else np.zeros((0, V))
    for i, token in enumerate(drafts):
        q_rows[i, token] += 0.1  # a draft has mass under the q it came from
    q_rows = q_rows / q_rows.sum(axis=1, keepdims=True) if k else q_rows
    p_rows = probabilities(logits, SamplingParams(temperature=0.0))
    assert verify_greedy(drafts, target) == verify(drafts, q_rows, p_rows, rng)


def test_greedy_tokens_are_where_probabilities_puts_the_mass_ties_to_the_lowest_id() -> None:
    logits = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 0.0, 0.0]], dtype=np.float32)
    assert greedy_tokens(logits) == [1, 0]
    one_hot_rows = probabilities(logits, SamplingParams(temperature=0.0))
    assert [int(np.flatnonzero(row)[0]) for row in one_hot_rows] == [1, 0]
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])  # K drafts need K + 1 target tokens
