"""Helpers for the tests that check a drafter leaves the sampled output distribution exact."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest

from chatapp.backends.fake import STOP_ID, FakeBackend
from chatapp.engine.loop import SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, probabilities
from chatapp.policy.fixed import FixedDraftLength
from tests.stat_tools import fits
from tests.test_ngram import _run


def uncertain_case(target: FakeBackend, sampling: SamplingParams,
                   cases: Iterable[tuple[list[int], int]]) -> tuple[list[int], int, np.ndarray]:
    """The first (prompt, token) of ``cases`` whose token the target gives a probability in
    (0.2, 0.8) after the prompt (so that acceptance and resampling both occur), and the target's
    distribution there; fails the test if there is none."""
    for prompt, token in cases:
        p = probabilities(target.evaluate(prompt, 1)[0], sampling)
        target.truncate(0)
        if 0.2 < p[token] < 0.8:
            return prompt, token, p
    pytest.fail("no suitable prompt")


def assert_two_token_distribution_exact(target: FakeBackend, prompt: list[int],
                                        sampling: SamplingParams,
                                        engine: Callable[[], SpeculativeEngine],
                                        samples: int = 4000, k: int = 3) -> None:
    """Sample the first two reply tokens ``samples`` times (seeds 0..samples-1) through
    ``engine()`` drafting ``k`` tokens a step, and check their joint distribution against the
    target's own, p(x, y) = p(x) p(y | prompt x) (the stop token ends a reply; it stands in for
    the missing second token). Also checks some proposals were accepted and some not."""
    vocab = target.vocab_size
    p = probabilities(target.evaluate(prompt, 1)[0], sampling)
    target.truncate(0)
    joint = np.zeros((vocab, vocab))
    for x in range(vocab):
        q = probabilities(target.evaluate(prompt + [x], 1)[0], sampling)
        target.truncate(0)
        joint[x] = p[x] * q if x != STOP_ID else np.eye(vocab)[STOP_ID] * p[x]
    counts = np.zeros((vocab, vocab))
    accepted = 0
    for seed in range(samples):
        out, done = _run(engine(), prompt, FixedDraftLength(k), 2, sampling, seed)
        out += [STOP_ID] * (2 - len(out))
        counts[out[0], out[1]] += 1
        accepted += done.stats.accepted > 0
    assert 0 < accepted < samples
    assert fits(counts.sum(axis=1), p)
    assert fits(counts.ravel(), joint.ravel())
