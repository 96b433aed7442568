"""A predicted output as a draft source (chatapp.drafters.prediction): it follows the reply
through the prediction and re-joins it after a change, and, verified like every other source,
it leaves the law of the replies the target's (a prediction can make a reply faster, never
different)."""

from __future__ import annotations

import numpy as np

from chatapp.drafters.combined import NgramModelDrafter
from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.model import ModelDrafter
from chatapp.drafters.prediction import PredictionSource, is_prediction_kind
from chatapp.drafters.sources import Candidate, agree, ahead_of_edits
from chatapp.engine.contracts import NO_HINTS, DraftBudget, DraftHints
from chatapp.engine.events import TokenSource
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.fixed import FixedDraftLength
from tests.test_exactness import (  # noqa: F401 (simulated_clock: the fixture, autouse)
    SAMPLES,
    VOCAB,
    backend,
    exact_law,
    matches_law,
    sample_replies,
    simulated_clock,
)


class Fed:
    """A source fed the context as the drafter feeds it: each token once, in order."""

    def __init__(self, source: PredictionSource) -> None:
        self.source = source
        self.fed = 0

    def propose(self, context: list[int], k: int) -> Candidate:
        for token in context[self.fed:]:
            self.source.append(token)
        self.fed = len(context)
        return self.source.propose(context, k)


def test_the_prediction_source_follows_the_reply_and_rejoins_after_a_change() -> None:
    predicted = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    prompt = [1, 2, 3]
    source = Fed(PredictionSource(predicted, len(prompt)))
    assert source.propose(prompt[:2], 4) == Candidate([], "prediction")  # no reply yet
    assert source.propose(prompt, 4).tokens == []  # nor the prediction's first token
    candidate = source.propose(prompt + [10], 4)
    assert candidate.tokens == [11, 12, 13, 14] and is_prediction_kind(candidate.kind)
    reply = [10, 11, 12, 99, 14, 15]  # 13 became 99, then the prediction again
    assert source.propose(prompt + reply, 3).tokens == [16, 17, 18]
    assert source.propose(prompt + reply + [16, 17], 3).tokens == [18, 19, 20]
    assert not is_prediction_kind("edit-run") and not is_prediction_kind("")


def test_the_prediction_waits_for_the_reply_to_write_its_first_token() -> None:
    """A reply that opens with something else (a code fence, a sentence) gets no proposal until
    it writes the prediction's first token; a prediction that repeats itself places no cursor
    before the reply starts."""
    predicted = [10, 11, 12, 10, 11, 12, 13]
    prompt = [1, 2, 3]
    source = Fed(PredictionSource(predicted, len(prompt)))
    opening = [50, 51, 52]
    assert source.propose(prompt + opening, 4).tokens == []
    assert source.propose(prompt + opening + [10], 4).tokens == [11, 12, 10, 11]


def test_an_empty_prediction_proposes_nothing() -> None:
    assert PredictionSource([], 2).propose([1, 2, 3], 4) == Candidate([], "prediction")


def test_the_drafter_drafts_the_prediction_once_the_reply_writes_its_first_token() -> None:
    """The engine prefills the prompt but its last token (fed with the first step): no proposal
    at the first step, the rest of the prediction once the reply has written its first token;
    the next reply, with hints of its own, has none."""
    drafter = NgramDrafter(64)
    prompt = [1, 2, 3, 4]
    drafter.prefill(prompt[:-1], DraftHints(predicted=(7, 8, 9, 10, 11)))
    rng = np.random.default_rng(0)
    assert drafter.propose(prompt, DraftBudget.uniform(3), SamplingParams(0.0), rng).tokens == []
    proposal = drafter.propose(prompt + [7], DraftBudget.uniform(3), SamplingParams(0.0), rng)
    assert proposal.tokens == [8, 9, 10] and is_prediction_kind(proposal.source)
    proposal = drafter.propose(prompt + [7, 8], DraftBudget.uniform(3), SamplingParams(0.0), rng)
    assert proposal.tokens == [9, 10, 11]
    drafter.prefill(prompt[:-1], NO_HINTS)
    assert drafter.propose(prompt, DraftBudget.uniform(3), SamplingParams(0.0), rng).tokens == []


def test_replies_with_a_prediction_follow_the_target_law() -> None:
    """Sampled at temperature 0.7 (fixed seed), the replies of the default drafter given a
    prediction that is partly right are distributed as the target alone makes them, and the
    prediction did draft (and was both accepted and rejected)."""
    params = SamplingParams(0.7, 0, 0.9)
    drafter = NgramModelDrafter(NgramDrafter(VOCAB), ModelDrafter(backend(noise=1.0)))
    # the prompt's pattern goes on "3 1 2"; then a guess
    hints = DraftHints(predicted=(3, 1, 2, 4, 5))
    replies, sources, drafted = sample_replies(drafter, lambda: FixedDraftLength(3), params,
                                               hints=hints)
    assert matches_law(replies, exact_law(params))
    predicted = sum(n for (source, size), n in drafted.items()
                    if source == "prediction" and size)
    # steps that drafted from the prediction: those of the replies that wrote its first token
    assert predicted > SAMPLES // 8
    assert sources[TokenSource.ACCEPTED] > 0 and sources[TokenSource.RESAMPLED] > 0


def test_the_prediction_drafts_before_the_edits_only_when_it_is_the_more_confident() -> None:
    assert ahead_of_edits("prediction-new", "")  # the edits propose nothing
    assert ahead_of_edits("prediction-run-long", "edit-run")
    assert ahead_of_edits("prediction-run", "edit-step")
    assert not ahead_of_edits("prediction-run", "edit-run")  # a tie: the edits
    assert not ahead_of_edits("prediction-step", "edit-new")


def test_a_prediction_that_proposes_what_the_edits_do_goes_under_the_kind_trusted_most() -> None:
    """The prompt quotes the predicted code: once the edits follow it too, the two propose the
    same tokens, one proposal cut to the larger of the two kinds' budgets and drafted under that
    kind; where the prediction says something else, it is a candidate of its own."""
    assert agree([13, 14], [13, 14, 15]) and agree([13, 14, 15], [13])
    assert not agree([], [1]) and not agree([13, 14], []) and not agree([13, 99], [13, 14])
    code = list(range(10, 30))
    prompt = [1, 2, *code, 3, 4]
    drafter = NgramDrafter(64)
    drafter.prefill(prompt[:-1], DraftHints(predicted=tuple(code)))
    reply = code[:6]  # the prediction follows from the reply's first token, the edits from later
    drafter.sync(prompt + reply, score=False)
    first = drafter.candidates(4)[0]  # the edits and the prediction: one candidate
    edit_kind, (prediction_kind,) = first.kind, first.also
    assert edit_kind.startswith("edit") and is_prediction_kind(prediction_kind)
    trusted = DraftBudget({edit_kind: 2, prediction_kind: 4})
    assert drafter.choose(trusted) == Candidate(code[6:10], prediction_kind)
    trusted = DraftBudget({edit_kind: 3, prediction_kind: 1})
    assert drafter.choose(trusted) == Candidate(code[6:9], edit_kind)
    changed = NgramDrafter(64)
    # the prediction goes on differently
    changed.prefill(prompt[:-1], DraftHints(predicted=(*code[:6], 77, 78, 79, 80)))
    changed.sync(prompt + reply, score=False)
    edits_held_back = DraftBudget({edit_kind: 0}, 4)  # the edits' kind may not draft
    assert changed.choose(edits_held_back) == Candidate([77, 78, 79, 80], "prediction-run")
