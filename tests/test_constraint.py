"""The engine's side of a grammar, without llguidance: cutting a proposal at its first refused
token, the masked law, and the token after a cut drawn from the residual against the refused
token's q (``verify``'s ``refused``), exact by enumeration."""

from __future__ import annotations

import numpy as np
import pytest

from chatapp.engine.constraint import constrain_draft, constrained_probabilities
from chatapp.engine.contracts import Proposal
from chatapp.engine.sampling import SamplingParams
from chatapp.engine.verify import verify

V = 4


class EvenAfterOdd:
    """A toy grammar over tokens 0..3: after an odd token only even ones, else any."""

    def __init__(self) -> None:
        self.consumed: list[int] = []

    def allowed(self) -> np.ndarray:
        odd_last = bool(self.consumed) and self.consumed[-1] % 2 == 1
        return np.array([True, not odd_last, True, not odd_last])

    def consume(self, token: int) -> None:
        assert self.allowed()[token]
        self.consumed.append(token)

    def rollback(self, n: int) -> None:
        del self.consumed[len(self.consumed) - n:]

    @property
    def accepting(self) -> bool:
        return True

    @property
    def finished(self) -> bool:
        return False


def test_a_proposal_is_cut_at_its_first_refused_token_with_the_masks_of_what_is_kept() -> None:
    constraint = EvenAfterOdd()
    rows = np.full((4, V), 0.25)
    rows[2] = [0.1, 0.2, 0.3, 0.4]
    draft = constrain_draft(constraint, Proposal([2, 1, 3, 0], rows, "model"))
    assert draft.proposal.tokens == [2, 1] and draft.proposal.source == "model"
    assert draft.masks.tolist() == [[True] * 4, [True] * 4, [True, False, True, False]]
    assert draft.refused is not None and draft.refused.tolist() == [0.1, 0.2, 0.3, 0.4]
    assert constraint.consumed == [2, 1]
    whole = constrain_draft(EvenAfterOdd(), Proposal.one_hot([0, 2], V, "ngram"))
    assert whole.proposal.tokens == [0, 2] and len(whole.masks) == 3 and whole.refused is None
    one_hot = constrain_draft(EvenAfterOdd(), Proposal.one_hot([1, 1], V, "ngram"))
    assert one_hot.proposal.tokens == [1] and one_hot.refused is None


def test_the_masked_law_is_the_targets_restricted_and_renormalised() -> None:
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    masked = constrained_probabilities(logits, np.array([[True, False, True, False]]),
                                       SamplingParams(1.0))
    assert masked[0] == pytest.approx([0.25, 0.0, 0.75, 0.0])
    top_1 = constrained_probabilities(logits, np.array([[True, False, True, False]]),
                                      SamplingParams(1.0, top_k=1))
    assert top_1[0].tolist() == [0.0, 0.0, 1.0, 0.0]  # top-k among the allowed tokens


@pytest.mark.parametrize("residual", [True, False])
def test_the_token_after_a_cut_follows_p_only_when_drawn_from_the_residual(residual) -> None:
    """One position, a draft x ~ q, the masked target law p (p(3) = 0): x refused is cut and the
    token drawn from norm(max(0, p - q)) (``refused=q``); else x is verified. The exact law of
    the result, summed over x, is p; drawing from p after a cut (the control) is not."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.1, 0.3, 0.5])
    law = np.zeros(V)
    for x in range(V):
        if p[x] == 0.0:
            law += q[x] * (_residual(p, q) if residual else p)
        else:
            accept = min(1.0, p[x] / q[x])
            law += q[x] * (accept * np.eye(V)[x] + (1 - accept) * _residual(p, q))
    assert np.allclose(law, p) == residual
    # and verify draws from that residual when given the refused row
    rng = np.random.default_rng(0)
    draws = [verify([], np.zeros((0, V)), p[None, :], rng, refused=q)[1] for _ in range(4000)]
    counts = np.bincount(draws, minlength=V) / 4000
    assert counts == pytest.approx(_residual(p, q), abs=0.03)


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    residual = np.maximum(p - q, 0.0)
    return residual / residual.sum()
