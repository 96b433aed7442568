"""logits -> probabilities: temperature, top-k, top-p; sampling by inverse CDF."""

from __future__ import annotations

import numpy as np
import pytest

from chatapp.backends.fake import FakeBackend
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.events import TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, probabilities, sample
from chatapp.policy.fixed import FixedDraftLength
from tests.stat_tools import fits

PROMPT = FakeBackend().tokenize("user: the draft\nassistant: ")


def test_greedy_is_one_hot_on_the_argmax() -> None:
    probs = probabilities(np.array([0.1, 3.0, 2.9, -1.0]), SamplingParams(0.0))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_temperature_one_is_softmax() -> None:
    logits = np.array([1.0, 2.0, 3.0])
    expected = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(probabilities(logits, SamplingParams(1.0)), expected)


def test_top_k_keeps_the_k_largest() -> None:
    probs = probabilities(np.array([1.0, 4.0, 3.0, 2.0]), SamplingParams(1.0, top_k=2))
    assert np.count_nonzero(probs) == 2 and probs[1] > probs[2] > 0
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = probabilities(logits, SamplingParams(1.0, top_p=0.8))
    assert np.allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    probs = probabilities(logits, SamplingParams(1.0, top_p=0.81))
    assert np.count_nonzero(probs) == 3


def test_top_p_on_a_large_flat_vocabulary_falls_back_to_a_full_sort() -> None:
    probs = probabilities(np.zeros(10_000), SamplingParams(1.0, top_p=0.5))
    assert np.count_nonzero(probs) == 5000


def test_rows_are_processed_independently() -> None:
    logits = np.array([[0.0, 1.0], [1.0, 0.0]])
    assert probabilities(logits, SamplingParams(0.0)).tolist() == [[0, 1], [1, 0]]


def reference_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The textbook definition, one full sort per row: what the fast path must reproduce."""
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k:
        kth = np.sort(scaled)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        size = int(np.searchsorted(np.cumsum(probs[order]), params.top_p - 1e-9)) + 1
        nucleus = np.zeros_like(probs)
        nucleus[order[:size]] = probs[order[:size]]
        probs = nucleus / nucleus.sum()
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


@pytest.mark.parametrize("spread", [0.3, 3.0, 12.0])  # flat (the floors fail), typical, peaky
@pytest.mark.parametrize("params", [SamplingParams(0.7), SamplingParams(1.0, top_p=0.9),
                                    SamplingParams(0.5, top_p=0.5), SamplingParams(1.3, top_k=50),
                                    SamplingParams(0.8, top_k=200, top_p=0.8),
                                    SamplingParams(1.0, min_p=0.05),
                                    SamplingParams(0.9, top_k=100, top_p=0.9, min_p=0.1)])
def test_fast_paths_match_the_textbook_definition(spread: float, params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((3, 20_000)) * spread).astype(np.float32)
    logits[:, rng.integers(0, 20_000, 5)] += 4.0  # a few likely tokens, as in a language model
    logits[0, :40] = logits[0, 40]  # ties at the top-k / top-p boundary
    got = probabilities(logits, params)
    for row, expected in zip(got, (reference_probabilities(r, params) for r in logits)):
        assert np.array_equal(row > 0, expected > 0)
        assert np.allclose(row, expected, rtol=1e-9, atol=1e-15)


def test_min_p_keeps_the_tokens_at_least_that_fraction_of_the_best() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = probabilities(logits, SamplingParams(1.0, min_p=0.3))
    assert np.allclose(probs, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(min_p=-0.1), dict(min_p=1.5)])
def test_out_of_range_params_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_sample_follows_the_distribution_and_never_picks_zero_mass() -> None:
    probs = np.array([0.0, 0.2, 0.0, 0.5, 0.3])
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(probs, rng) for _ in range(5000)], minlength=5)
    assert counts[0] == counts[2] == 0
    assert fits(counts, probs)


def test_same_seed_same_reply_through_the_engine() -> None:
    """The engine draws only from the generator it is given: the same seed gives the same
    sampled reply (drafts, rejections and all), another seed another reply."""
    def reply(seed: int) -> list[int]:
        engine = SpeculativeEngine(FakeBackend(), ModelDrafter(FakeBackend(noise=1.0)))
        settings = GenerationSettings(SamplingParams(temperature=1.0), max_tokens=40)
        return [e.id for e in engine.generate(PROMPT, settings, np.random.default_rng(seed),
                                              FixedDraftLength(3)) if isinstance(e, TokenEvent)]

    assert reply(42) == reply(42)
    assert len({tuple(reply(seed)) for seed in range(5)}) > 1
