"""Drafters besides the plain draft model: prompt lookup (n-gram), and n-gram then model.

``NgramDrafter`` (prompt-lookup decoding): the continuation of the most recent earlier occurrence
of the longest suffix of the context (n-gram sizes ``min_n..max_n``, longest first). It costs no
model call. Its proposal is deterministic given the context, so its distribution is one-hot and
verification stays exact at any temperature (acceptance probability p(x)). The index maps every
n-gram to the end of its most recent occurrence that has a continuation; it is extended with the
tokens appended since the last call (O(new tokens x sizes)), and rebuilt only when the context is
not an extension of what it has seen (a new conversation, an edited one).

Because its proposals cost nothing, it can also tell how they would have fared: it replays
"speculate with ``lookahead`` n-gram tokens at every step" over the tokens that were emitted and
returns each would-be step as a ``ShadowScore`` with its next proposal, which the engine passes to
the policy, even while the policy is not drafting. Matching a token the target emitted is an
unbiased draw of the acceptance of a one-hot proposal (the target emitted x with probability
p(x), which is the acceptance probability), so the policy learns the true acceptance rate at
K = 0 and switches back on as soon as the text starts repeating (code being edited, a quoted
passage).

With ``edits`` (the default) an ``EditTracker`` (``chatapp.drafters.edits``: speculative edits)
comes first, and with a ``suffix`` source (``chatapp.drafters.suffix``: the history-wide suffix
index) a confident continuation from it comes before the lookup; a "suffix-long" one (an earlier
chat's text being written again) even before the edits, unless they are in a confident run. Each
source is replayed and scored under its own kinds. All are free and one-hot. A reply may also be
given a predicted output (``DraftHints.predicted``: ``chatapp.drafters.prediction``): where it
proposes what the edits do, the two are one proposal, budgeted under whichever of their kinds has
the larger budget; else it comes first when the edits propose nothing or its cursor is the more
confident, else just before the lookup.

``NgramModelDrafter`` ("ngram+model"): the n-gram drafter's proposal when there is one, else the
draft model. Each source reports its own name, so the policy keeps acceptance and cost statistics
per source and, on a machine where the draft model does not pay, gives it a budget of 0 while
keeping the n-gram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from chatapp.drafters.edits import EDIT_RUN, EditTracker
from chatapp.drafters.prediction import PredictionSource, agree, ahead_of_edits
from chatapp.drafters.suffix import SuffixSource
from chatapp.drafters.suffix_index import SUFFIX_LONG
from chatapp.engine.contracts import (
    LONGEST_FREE_DRAFT,
    DraftBudget,
    DraftHints,
    Proposal,
    ShadowScore,
)
from chatapp.engine.sampling import SamplingParams

NGRAM_KIND = "ngram"
LONG_MATCH = 3  # an n-gram match this long or longer is a "long" match


class NgramIndex:
    """The tokens seen so far, and for each n-gram the end of its latest occurrence with a
    continuation (the index of the token that followed it)."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        """Add one token; it becomes the continuation of the n-grams that end just before it."""
        tokens, end = self.tokens, len(self.tokens)
        for n in range(self.min_n, min(self.max_n, end) + 1):
            self._ends[tuple(tokens[end - n:end])] = end
        tokens.append(token)

    def lookup(self, k: int) -> list[int]:
        """Up to ``k`` tokens continuing ``self.tokens``; see ``search``."""
        return self.search(k)[0]

    def search(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens continuing ``self.tokens`` by chained longest-suffix lookup, and the
        size of the n-gram the first lookup matched (0: no match).

        When a continuation runs into the end of the known tokens, the lookup starts again from
        the tokens proposed so far (a repeating pattern continues).
        """
        out: list[int] = []
        first_n = 0
        tokens = self.tokens
        while len(out) < k:
            end, n = self._match(out)
            if end is None:
                break
            first_n = first_n or n
            take = tokens[end:end + (k - len(out))]
            if not take:
                break
            out.extend(take)
        return out, first_n

    def _match(self, tail: list[int]) -> tuple[int | None, int]:
        """Where the continuation of the longest matched suffix of tokens + tail starts, and the
        size of that suffix."""
        tokens = self.tokens
        length = len(tokens) + len(tail)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            if len(tail) >= n:
                key = tuple(tail[len(tail) - n:])
            else:
                key = tuple(tokens[len(tokens) - (n - len(tail)):]) + tuple(tail)
            end = self._ends.get(key)
            if end is not None:
                return end, n
        return None, 0


Search = Callable[[int], tuple[list[int], str]]  # up to k tokens and their kind
Candidate = tuple[list[int], tuple[str, ...]]  # a proposal and the kinds of the sources making it


class ShadowReplay:
    """One source's would-be speculation at every step, replayed over the emitted tokens: at
    ``at`` it would have proposed ``proposal`` (of ``kind``); ``settle`` scores it."""

    def __init__(self, search: Search, lookahead: int, at: int = 0) -> None:
        self.search = search
        self.lookahead = lookahead
        self.at = at
        self.proposal: list[int] = []
        self.kind = ""

    def start_if_due(self, position: int) -> None:
        """Make the would-be proposal of a step starting at ``position``, if one starts there."""
        if position == self.at and not self.proposal:
            self.proposal, self.kind = self.search(self.lookahead)
            if not self.proposal:
                self.at += 1  # no proposal: that step would have been plain

    def settle(self, tokens: Sequence[int]) -> ShadowScore | None:
        """The pending proposal's score once the emitted ``tokens`` decide it; None while
        undecided or idle."""
        proposal, start = self.proposal, self.at
        if not proposal:
            return None
        known = len(tokens) - start
        matched = 0
        while matched < min(known, len(proposal)) and tokens[start + matched] == proposal[matched]:
            matched += 1
        if matched < len(proposal) and matched == known:
            return None  # every emitted token so far matched; wait for more
        self.at = start + matched + 1  # the target's own token follows the accepted ones
        self.proposal = []
        return ShadowScore(self.kind, len(proposal), matched)


class NgramDrafter:
    """Prompt lookup, speculative edits and the suffix index; see the module docstring.
    Implements ``Drafter``. Each source is replayed for the policy's shadow scores with its own
    look-ahead (``lookahead`` tokens for the lookup, ``edit_lookahead`` for the edits,
    ``suffix_lookahead`` for the suffix index)."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4,
                 lookahead: int = LONGEST_FREE_DRAFT, kind: str = NGRAM_KIND,
                 kind_by_context: bool = True, edits: bool = True,
                 edit_lookahead: int = LONGEST_FREE_DRAFT, suffix: SuffixSource | None = None,
                 suffix_lookahead: int = LONGEST_FREE_DRAFT,
                 ends_line: Callable[[int], bool] | None = None) -> None:
        self.vocab_size = vocab_size
        self.min_n = min_n
        self.max_n = max_n
        self.lookahead = lookahead
        self.kind = kind
        self.kind_by_context = kind_by_context
        self.edits = edits
        self.edit_lookahead = edit_lookahead
        self.suffix = suffix
        self.suffix_lookahead = suffix_lookahead
        self.ends_line = ends_line
        self._index = NgramIndex(min_n, max_n)
        self._tracker = self._new_tracker()
        self._seen: Any = None  # the context object last synced (the engine appends to it)
        self._streak = "cold"  # how the latest scored lookup fared: hot (all), warm, cold (none)
        self._scores: list[ShadowScore] = []  # settled since the last proposal
        self.prediction: PredictionSource | None = None  # the reply's, from its prefill on
        self._replays = self._new_replays(0)

    @property
    def name(self) -> str:
        return "ngram"

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        """A reply starts: its predicted output (``hints.predicted``) becomes a source until the
        next ``prefill``, the suffix index follows the hints' document (``SuffixSource.follow``),
        and every source is fed ``context``."""
        self.prediction = PredictionSource(hints.predicted, len(context) + 1, self.ends_line) if (
            hints.predicted) else None
        if self.suffix is not None:
            self.suffix.follow(hints)
        self.sync(context, score=False)
        if self._tracker is not None:
            self._tracker.start_reply()  # a new reply: its own edits

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Nothing: the sources hold emitted tokens only, never drafts."""

    def close(self) -> None:
        """Nothing to free: no model."""

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.sync(context, score=True)
        return self.proposal(*self.choose(budget))

    def choose(self, budget: DraftBudget) -> tuple[list[int], str]:
        """The proposal to draft after the last ``sync`` and its kind: the first candidate (see
        the module docstring for the order) with a budget above 0, cut to it; a candidate that
        several sources make goes under the kind with the largest budget."""
        for tokens, kinds in self._candidates(budget.most):
            kind = max(kinds, key=budget.for_source)
            tokens = tokens[:budget.for_source(kind)]
            if tokens:
                return tokens, kind
        return [], self.kind

    def proposal(self, tokens: list[int], kind: str) -> Proposal:
        """``tokens`` (from ``search``) as a one-hot proposal of ``kind``, with the shadow scores
        settled since the last proposal."""
        scores = tuple(self._scores)
        self._scores.clear()
        if not tokens:
            return Proposal.empty(self.vocab_size, scores)
        return Proposal.one_hot(tokens, self.vocab_size, kind, scores)

    def search(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` tokens continuing the context of the last ``sync`` from the first source
        that has a proposal, and their kind."""
        tokens, kinds = next(self._candidates(k), ([], (self.kind,)))
        return tokens, kinds[0]

    def _candidates(self, k: int) -> Iterator[Candidate]:
        predicted, edit = self.prediction_search(k), self._edit_search(k)
        edit_kinds: tuple[str, ...] = (edit[1],)
        if agree(predicted[0], edit[0]):
            edit_kinds += (predicted[1],)
            edit = (max(edit[0], predicted[0], key=len), edit[1])
            predicted = ([], "")
        early = bool(predicted[0]) and ahead_of_edits(predicted[1], edit[1] if edit[0] else "")
        if early:
            yield predicted[0], (predicted[1],)
        suffix = self.suffix_search(k)
        first = suffix[1] == SUFFIX_LONG and not edit[1].startswith(EDIT_RUN)  # else edits first
        ordered = [(suffix[0], (suffix[1],)), (edit[0], edit_kinds)]
        for tokens, kinds in (ordered if first else ordered[::-1]):
            if tokens:
                yield tokens, kinds
        if predicted[0] and not early:
            yield predicted[0], (predicted[1],)
        tokens, kind = self.lookup(k)
        if tokens:
            yield tokens, (kind,)

    def _edit_search(self, k: int) -> tuple[list[int], str]:
        """The edit tracker's proposal (none without ``edits``)."""
        if self._tracker is None:
            return [], ""
        return self._tracker.propose(k)

    def prediction_search(self, k: int) -> tuple[list[int], str]:
        """The predicted output's proposal (none without a prediction)."""
        if self.prediction is None:
            return [], ""
        return self.prediction.propose(self._index.tokens, k)

    def suffix_search(self, k: int) -> tuple[list[int], str]:
        """The suffix index's proposal (none without a ``suffix`` source)."""
        if self.suffix is None:
            return [], ""
        return self.suffix.propose(self._index.tokens, k)

    def lookup(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` tokens of n-gram lookup, and their kind.

        With ``kind_by_context`` the kind says how long the matched n-gram is ("long": at least
        ``LONG_MATCH`` tokens) and how the latest scored proposal fared ("hot": all of it matched,
        "warm": some, "cold": none), e.g. "ngram-long-hot". Acceptance comes in runs (code being
        copied, then an edit, then prose), so the policy learns how far to trust a proposal in
        each case instead of one average (in the code-editing prompts of the bench, the first
        token of a long match right after a fully matched proposal is right about 85% of the
        time, that of a short match after a miss about 45%)."""
        tokens, n = self._index.search(k)
        return tokens, self._kind(n)

    def _kind(self, n: int) -> str:
        if not self.kind_by_context:
            return self.kind
        return f"{self.kind}-{'long' if n >= LONG_MATCH else 'short'}-{self._streak}"

    def sync(self, context: Sequence[int], score: bool) -> None:
        """Feed every source the tokens of ``context`` not seen yet (start over if it is not an
        extension); with ``score``, replay each source's speculation over them and keep how it
        would have fared for the next proposal's ``scores``."""
        index = self._index
        known = len(index)
        extends = len(context) >= known and (
            (context is self._seen and (known == 0 or context[known - 1] == index.tokens[-1]))
            or list(context[:known]) == index.tokens)
        if not extends:
            self._index = index = NgramIndex(self.min_n, self.max_n)
            self._tracker = self._new_tracker()
            self._replays = self._new_replays(0)
            known = 0
        if known == 0 and self.suffix is not None:
            self.suffix.reset()  # the context is the open chat's whole text
        self._seen = context
        tracker, suffix, replays = self._tracker, self.suffix, self._replays
        for position in range(known, len(context)):
            if score:
                for replay in replays:
                    replay.start_if_due(position)
            token = context[position]
            index.append(token)
            if tracker is not None:
                tracker.append(token)
            if suffix is not None:
                suffix.append(token)
            if score:
                self._settle(replays)
        if not score:  # nothing replayed: start replaying from here next time
            self._replays = self._new_replays(len(index))

    def _new_tracker(self) -> EditTracker | None:
        return EditTracker(ends_line=self.ends_line) if self.edits else None

    def _settle(self, replays: list[ShadowReplay]) -> None:
        """Keep the scores the latest token decided; the lookup's (the first) sets the streak."""
        for replay in replays:
            scored = replay.settle(self._index.tokens)
            if scored is None:
                continue
            self._scores.append(scored)
            if replay is replays[0]:
                self._streak = ("hot" if scored.matched == scored.proposed
                                else ("warm" if scored.matched else "cold"))

    def _new_replays(self, at: int) -> list[ShadowReplay]:
        """A replay per source, from position ``at``: the lookup, the edits, the suffix index,
        the predicted output."""
        replays = [ShadowReplay(self.lookup, self.lookahead, at)]
        if self.edits:
            replays.append(ShadowReplay(self._edit_search, self.edit_lookahead, at))
        if self.suffix is not None:
            replays.append(ShadowReplay(self.suffix_search, self.suffix_lookahead, at))
        if self.prediction is not None:
            replays.append(ShadowReplay(self.prediction_search, self.edit_lookahead, at))
        return replays
