"""Statistical: through the whole engine, speculative sampling reproduces the target's law exactly.

A small fake vocabulary (5 tokens that can be emitted) makes the exact law of the reply's first
four tokens computable by enumeration (625 sequences), so the test compares the joint
distribution of whole replies, not one token: with K = 3 and four tokens, the first step drafts
three tokens, and a fully accepted step ends in a bonus token. Each case runs a fixed number of
replies with a fixed seed and applies a chi-square test at alpha = 1e-4; the negative control
shows the same test rejects a verifier with the classic bug (resampling from p instead of the
residual norm(max(0, p - q))).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import chatapp.engine.loop
import chatapp.engine.verify as speculative
from chatapp.backends.fake import STOP_ID, FakeBackend
from chatapp.drafters.combined import NgramModelDrafter
from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.constraint import TokenConstraint
from chatapp.engine.contracts import NO_HINTS, Drafter, DraftHints, DraftPolicy, source_family
from chatapp.engine.events import StepEvent, TokenEvent, TokenSource
from chatapp.engine.kv import evaluate_sequence
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, probabilities
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import FixedDraftLength
from tests.stat_tools import fits

VOCAB = 6  # token 0 is the stop token, made unreachable so every reply has four tokens
REPLY = 4
SAMPLES = 4000
PROMPT = [1, 2, 3, 1, 2]  # "1 2" repeats: the n-gram proposes "3 1 2"


class SimulatedClock:
    """The engine's clock in these tests: it moves only when a model evaluates, by that model's
    cost per call, so timings (and the auto policy's choices) are the same on any machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


CLOCK = SimulatedClock()
TARGET_CALL_S, DRAFT_CALL_S = 0.010, 0.001  # verifying n tokens costs what one does (a GPU)


class TimedBackend(FakeBackend):
    """A fake model whose every evaluation advances ``CLOCK`` by ``call_s``."""

    def __init__(self, call_s: float, noise: float) -> None:
        super().__init__(vocab_size=VOCAB, sharpness=1.0, noise=noise)
        self.call_s = call_s
        self._table[:, STOP_ID] = -1e4  # replies never stop early: the law of 4 tokens is complete

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        CLOCK.now += self.call_s
        return super().evaluate(tokens, n_logits)


@pytest.fixture(autouse=True)
def simulated_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chatapp.engine.loop, "time", CLOCK)


def backend(noise: float = 0.0) -> FakeBackend:
    """The target (``noise`` 0) or a draft model (``noise`` > 0: it disagrees now and then)."""
    return TimedBackend(DRAFT_CALL_S if noise else TARGET_CALL_S, noise)


def exact_law(params: SamplingParams,
              allowed: Callable[[tuple[int, ...]], np.ndarray] | None = None,
              ) -> dict[tuple[int, ...], float]:
    """P(first REPLY tokens = s) under the target alone, for every sequence s; with ``allowed``
    (the tokens a grammar allows after a prefix), the target's logits masked by it."""
    target = backend()
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(REPLY):
        longer = {}
        for prefix, mass in law.items():
            logits = evaluate_sequence(target, PROMPT + list(prefix), 1)[0]
            if allowed is not None:
                logits = np.where(allowed(prefix), logits, -np.inf)
            p = probabilities(logits, params)
            for token in range(1, VOCAB):
                longer[prefix + (token,)] = mass * p[token]
        law = longer
    return law


def sample_replies(drafter: Drafter, make_policy: Callable[[], DraftPolicy],
                   params: SamplingParams, seed: int = 7, hints: DraftHints = NO_HINTS,
                   constraint: Callable[[], TokenConstraint | None] = lambda: None,
                   ) -> tuple[Counter, Counter, Counter]:
    """(reply counts, token sources, (source, drafted) of the steps) over SAMPLES replies, each
    given ``hints`` and a new ``constraint()``."""
    engine = SpeculativeEngine(backend(), drafter)
    rng = np.random.default_rng(seed)
    settings = GenerationSettings(params, REPLY)
    policy = make_policy()
    replies, sources, drafted = Counter(), Counter(), Counter()
    for _ in range(SAMPLES):
        reply = []
        for event in engine.generate(PROMPT, settings, rng, policy, hints=hints,
                                     constraint=constraint()):
            if isinstance(event, TokenEvent):
                reply.append(event.id)
                sources[event.source] += 1
            elif isinstance(event, StepEvent):
                drafted[(source_family(event.source), event.drafted)] += 1
        replies[tuple(reply)] += 1
    return replies, sources, drafted


def matches_law(replies: Counter, law: dict[tuple[int, ...], float]) -> bool:
    keys = list(law)
    assert sum(replies.values()) == SAMPLES and set(replies) <= set(keys)
    counts = np.array([replies[key] for key in keys], dtype=np.float64)
    return fits(counts, np.array([law[key] for key in keys]))


def model_drafter() -> Drafter:
    return ModelDrafter(backend(noise=1.0))


def ngram_model_drafter() -> Drafter:
    return NgramModelDrafter(NgramDrafter(VOCAB), ModelDrafter(backend(noise=1.0)))


CASES = {
    "model K=3, temperature 1": (model_drafter, lambda: FixedDraftLength(3), SamplingParams(1.0)),
    "model K=3, top-k 3": (model_drafter, lambda: FixedDraftLength(3), SamplingParams(0.8, 3)),
    "model K=3, top-p 0.8": (model_drafter, lambda: FixedDraftLength(3),
                             SamplingParams(1.2, 0, 0.8)),
    "model, auto policy": (model_drafter, AutoDraftLength, SamplingParams(1.0, 4, 0.95)),
    "ngram+model K=3, temperature 0.7": (ngram_model_drafter, lambda: FixedDraftLength(3),
                                         SamplingParams(0.7, 0, 0.9)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_replies_follow_the_target_law(case: str) -> None:
    make_drafter, make_policy, params = CASES[case]
    replies, sources, drafted = sample_replies(make_drafter(), make_policy, params)
    assert matches_law(replies, exact_law(params))
    # what the case claims to exercise did happen: drafts of 2+ tokens, rejections, bonus tokens
    assert sum(n for (_, size), n in drafted.items() if size >= 2) > SAMPLES // 4
    assert sources[TokenSource.RESAMPLED] > 0 and sources[TokenSource.BONUS] > 0
    if case.startswith("ngram+model"):
        # the lookup and the model both drafted (and the speculative edits may have)
        assert {"ngram", "model"} <= {source for source, size in drafted if size} <= {
            "ngram", "edit", "model"}


def test_the_test_rejects_a_verifier_that_resamples_from_p(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the classic bug (at a rejection, draw from p, not the residual) skews
    the law towards tokens the draft likes; the same harness must notice."""
    monkeypatch.setattr(speculative, "_residual", lambda p, q: p)
    _, make_policy, params = CASES["model K=3, temperature 1"]
    replies, _, _ = sample_replies(model_drafter(), make_policy, params)
    assert not matches_law(replies, exact_law(params))


def test_exact_law_is_a_distribution() -> None:
    law = exact_law(SamplingParams(1.0))
    assert len(law) == (VOCAB - 1) ** REPLY
    assert sum(law.values()) == pytest.approx(1.0)
    assert all(len(key) == REPLY for key in itertools.islice(law, 5))
