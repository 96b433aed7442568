"""Statistical: under a grammar, speculative sampling through the whole engine emits the target's
law restricted to the grammar and renormalised, exactly.

The fake vocabulary of tests/test_exactness.py (tokens a..e, the stop token unreachable) and the
grammar ``("ab" | "ac" | "b" | "d")+``: after an unfinished "a" only "b" or "c" may follow, else
"a", "b" or "d"; "e" never. The exact law of the reply's first four tokens is computed by
enumeration with that rule written out by hand (not with llguidance), and the replies sampled
through the engine (a noisy draft model drafting K = 3, so drafts are refused, cut, accepted and
rejected) are compared with it by a chi-square test at alpha = 1e-4 with fixed seeds. Two negative
controls show the same test rejects the two ways of getting it wrong: a verifier that draws the
token after a cut draft from p (ignoring the refused token's q), and a target law masked but not
renormalised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import chatapp.engine.loop as loop
from chatapp.engine.constraint import ConstrainedDraft, TokenConstraint
from chatapp.engine.contracts import Drafter, Proposal
from chatapp.engine.events import TokenSource
from chatapp.engine.sampling import SamplingParams, probabilities
from chatapp.grammar.matcher import Grammars
from chatapp.policy.fixed import FixedDraftLength
from tests import test_exactness as unconstrained
from tests.test_exactness import (
    SAMPLES,
    VOCAB,
    backend,
    exact_law,
    matches_law,
    model_drafter,
    ngram_model_drafter,
)

GRAMMAR = 'start: ("ab" | "ac" | "b" | "d")+'
A, B, C, D = 1, 2, 3, 4


def allowed_by_hand(reply: Sequence[int]) -> np.ndarray:
    """The tokens ``GRAMMAR`` allows after ``reply`` (its rule written out): "b" or "c" after an
    unfinished "a", else "a", "b", "d" (the stop token too, but it is unreachable here)."""
    pending = False
    for token in reply:
        pending = token == A and not pending
    mask = np.zeros(VOCAB, dtype=bool)
    mask[[B, C] if pending else [A, B, D]] = True
    return mask


def sample_replies(drafter: Drafter, params: SamplingParams) -> tuple[Counter, Counter]:
    """(reply counts, token sources) over SAMPLES replies under ``GRAMMAR``, K = 3."""
    grammars = Grammars(backend())
    replies, sources, drafted = unconstrained.sample_replies(
        drafter, lambda: FixedDraftLength(3), params, seed=11,
        constraint=lambda: grammars.constraint(GRAMMAR, "test grammar"))
    assert max(size for _, size in drafted) >= 2  # drafts of two tokens or more were verified
    return replies, sources


@pytest.fixture
def cuts(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts what the grammar did to the engine's proposals."""
    counted: Counter = Counter()
    cut = loop.constrain_draft

    def counting(constraint: TokenConstraint, proposal: Proposal) -> ConstrainedDraft:
        draft = cut(constraint, proposal)
        counted["refused" if len(draft.proposal.tokens) < len(proposal.tokens) else "whole"] += 1
        return draft

    monkeypatch.setattr(loop, "constrain_draft", counting)
    return counted


CASES: dict[str, tuple[Callable[[], Drafter], SamplingParams]] = {
    "model, temperature 1": (model_drafter, SamplingParams(1.0)),
    "model, top-k 3": (model_drafter, SamplingParams(0.8, 3)),
    "ngram+model, top-p 0.9": (ngram_model_drafter, SamplingParams(0.7, 0, 0.9)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_constrained_replies_follow_the_masked_target_law(case: str, cuts: Counter) -> None:
    make_drafter, params = CASES[case]
    replies, sources = sample_replies(make_drafter(), params)
    assert matches_law(replies, exact_law(params, allowed_by_hand))
    # what the test claims to exercise did happen: cut drafts, whole ones, rejections, bonuses
    assert cuts["refused"] > SAMPLES // 10 and cuts["whole"] > SAMPLES // 10
    assert sources[TokenSource.ACCEPTED] > SAMPLES // 2
    assert sources[TokenSource.RESAMPLED] > 0 and sources[TokenSource.BONUS] > 0


def test_the_test_rejects_a_cut_draft_followed_by_a_draw_from_p(
        monkeypatch: pytest.MonkeyPatch, cuts: Counter) -> None:
    """Negative control: cutting a draft at a refused token and drawing the next token from p
    (not from norm(max(0, p - q)) with the refused token's q) skews the law."""
    verify = loop.verify
    monkeypatch.setattr(loop, "verify", lambda *args: verify(*args[:4]))
    make_drafter, params = CASES["model, temperature 1"]
    replies, _ = sample_replies(make_drafter(), params)
    assert not matches_law(replies, exact_law(params, allowed_by_hand))


def test_the_test_rejects_a_mask_without_renormalisation(
        monkeypatch: pytest.MonkeyPatch, cuts: Counter) -> None:
    """Negative control: the target's law with the refused tokens zeroed but not renormalised
    (drafts accepted with min(1, p(x) / q(x)) against too small a p)."""
    monkeypatch.setattr(loop, "constrained_probabilities",
                        lambda logits, masks, params: probabilities(logits, params) * masks)
    make_drafter, params = CASES["model, temperature 1"]
    replies, _ = sample_replies(make_drafter(), params)
    assert not matches_law(replies, exact_law(params, allowed_by_hand))


def test_the_hand_written_rule_is_the_grammar() -> None:
    """``allowed_by_hand`` agrees with the compiled grammar on every reply the law can draw."""
    target = backend()
    grammars = Grammars(target)
    law = exact_law(SamplingParams(1.0), allowed_by_hand)
    for reply in (reply for reply, mass in law.items() if mass > 0):
        constraint = grammars.constraint(GRAMMAR, "test grammar")
        for i, token in enumerate(reply):
            assert np.array_equal(constraint.allowed()[1:], allowed_by_hand(reply[:i])[1:])
            constraint.consume(token)
