"""A predicted output as a draft source: most of the reply is known, here it is.

An API client can send the text it expects the reply to be (OpenAI's ``prediction``: an editor
sends the file being edited). ``PredictionSource`` drafts from it with the speculative edits'
tracker (``chatapp.drafters.edits.EditTracker``) over the prediction's tokens followed by the
reply's own: the cursor is placed after the prediction's first token once the reply writes that
token (a reply often opens with a code fence or a sentence before the predicted text; the
tracker's own acquisition may place it earlier), follows the reply through the prediction, and
re-joins it after a change (a renamed variable, an inserted line) as it re-joins the source of an
edit. Its proposals are one-hot and of their own kinds
("prediction-run", "prediction-new", ...: the edit kinds renamed), so the engine verifies them
exactly like every other source's and the policy learns how far to trust each: a prediction can
make a reply faster, never different; a wrong one costs a few rejected drafts until the policy's
shadow scores give it a budget of 0.

``NgramDrafter.prefill`` makes one for the reply whose hints carry a prediction
(``DraftHints.predicted``); the next reply's ``prefill`` ends it. The prompt usually quotes the
predicted text too (the code to edit), which the speculative edits already follow: where the two
propose the same continuation (``chatapp.drafters.sources.agree``) it is one proposal, budgeted
under whichever of the two kinds the policy trusts with more tokens (the prediction's kinds are the
family ``PREDICTION_SOURCE``, whose acceptance a policy carries from one predicted reply to the
next, while the edits' is relearnt every reply); where they differ,
``chatapp.drafters.sources.ahead_of_edits`` lets the prediction draft first only where its cursor is
the more confident of the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chatapp.drafters.edits import EDIT_KIND, EditTracker
from chatapp.drafters.sources import Candidate
from chatapp.engine.contracts import PREDICTION_SOURCE, source_family


class PredictionSource:
    """Proposals from ``tokens`` (the predicted reply) for a reply that starts at context position
    ``reply_start``; a ``Source`` whose next appended token is at context position ``at``. See
    the module docstring."""

    def __init__(self, tokens: Sequence[int], reply_start: int,
                 ends_line: Callable[[int], bool] | None = None, at: int = 0) -> None:
        self.tokens = list(tokens)
        self.reply_start = reply_start
        self._tracker = EditTracker(ends_line=ends_line)
        for token in self.tokens:
            self._tracker.append(token)
        self._tracker.start_reply()
        self._tracker.unfollow()  # where the prediction repeats itself says nothing of the reply
        self._at = at  # the context position of the next token appended
        self._fed = 0  # reply tokens given to the tracker

    def restart(self) -> None:
        """The context starts over (its tokens are appended again from position 0): the reply
        tokens already given to the tracker are not given twice."""
        self._at = 0

    def append(self, token: int) -> None:
        """The context grew by ``token``; a reply token not seen yet goes to the tracker."""
        if self._at == self.reply_start + self._fed:
            self._fed += 1
            self._tracker.append(token)
            if not self._tracker.following and token == self.tokens[0]:
                self._tracker.follow_from(1)  # the reply has started writing the prediction
        self._at += 1

    def propose(self, context: Sequence[int], k: int) -> Candidate:
        """Up to ``k`` tokens continuing ``context`` (the prompt, then the reply so far) from the
        prediction; nothing before the reply starts."""
        if len(context) < self.reply_start or not self.tokens:
            return Candidate([], PREDICTION_SOURCE)
        tokens, kind = self._tracker.propose(k)
        return Candidate(tokens, PREDICTION_SOURCE + kind[len(EDIT_KIND):])


def is_prediction_kind(kind: str) -> bool:
    """Whether a proposal of ``kind`` came from a prediction."""
    return source_family(kind) == PREDICTION_SOURCE
