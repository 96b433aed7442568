"""A grammar the reply must match, as the engine sees it: which tokens may come next.

``TokenConstraint`` is the engine's whole view of a grammar (llguidance's matcher implements it
outside the engine, in ``chatapp.grammar``): the allowed-token mask at the current state, consume
a token, roll back tokens, whether the text so far is a complete match. Stop tokens are tokens
like any other to it: allowed exactly where the grammar accepts.

How the engine keeps speculative sampling exact under a constraint (``SpeculativeEngine``):

- the target's law at every verified position is ``constrained_probabilities``: the logits of
  refused tokens set to -inf before temperature, top-k and top-p, so the law is the target's
  restricted to the grammar and renormalised (greedy: the argmax of the masked logits);
- ``constrain_draft`` cuts a proposal at its first refused token before verification and
  advances the constraint over the tokens kept, collecting the mask at each verified position;
- the cut keeps the refused token's draft distribution: had the token been verified, it would
  have been rejected (its masked probability is 0) and the replacement drawn from
  norm(max(0, p - q)); so where every kept token is accepted, the next token is drawn from that
  residual, not from p (``verify``'s ``refused``). Drawing it from p would skew the law towards
  tokens the draft avoids. For a one-hot proposal the residual is p itself;
- after verification the constraint rolls back the rejected drafts and consumes the token drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from chatapp.engine.contracts import Proposal
from chatapp.engine.sampling import SamplingParams, probabilities


class TokenConstraint(Protocol):
    """The state of a grammar over the tokens of one reply so far."""

    def allowed(self) -> np.ndarray:
        """Bool (vocab_size,): the tokens that may come next; a stop token only where the
        grammar accepts. At least one token is allowed."""
        ...

    def consume(self, token: int) -> None:
        """Advance over ``token``, which ``allowed()`` allows."""
        ...

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens consumed."""
        ...

    @property
    def accepting(self) -> bool:
        """The tokens consumed so far are a complete match (the reply may end here)."""
        ...

    @property
    def finished(self) -> bool:
        """Nothing but a stop token may come next: the reply is over."""
        ...


@dataclass(frozen=True)
class ConstrainedDraft:
    """A proposal cut at its first refused token.

    ``proposal``: the tokens the grammar allows in a row (the constraint has consumed them);
    ``masks`` (len(proposal.tokens) + 1, V): the allowed tokens at each verified position;
    ``refused``: the distribution the first refused token was drawn from (None: no token was
    refused, or the proposal was one-hot, whose residual is p itself).
    """

    proposal: Proposal
    masks: np.ndarray
    refused: np.ndarray | None


def constrain_draft(constraint: TokenConstraint, proposal: Proposal) -> ConstrainedDraft:
    """Cut ``proposal`` at its first token ``constraint`` refuses, advancing the constraint over
    the tokens kept; see ``ConstrainedDraft``."""
    masks = []
    for i, token in enumerate(proposal.tokens):
        mask = constraint.allowed()
        masks.append(mask)
        if not mask[token]:
            refused = None if proposal.rows is None else proposal.rows[i]
            return ConstrainedDraft(proposal.cut(i), np.stack(masks), refused)
        constraint.consume(token)
    masks.append(constraint.allowed())
    return ConstrainedDraft(proposal, np.stack(masks), None)


def masked_logits(logits: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``logits`` (n, V) with every token a row of ``masks`` (n, V) refuses at -inf."""
    return np.where(masks, logits, -np.inf)


def constrained_probabilities(logits: np.ndarray, masks: np.ndarray,
                              params: SamplingParams) -> np.ndarray:
    """The target's law at each row restricted to the tokens ``masks`` allows, renormalised
    (the mask applies before temperature, top-k and top-p, so some token always stays)."""
    return probabilities(masked_logits(logits, masks), params)
