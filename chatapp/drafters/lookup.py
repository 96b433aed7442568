"""The default drafter's free sources together (``NgramDrafter``), and the n-gram lookup.

``NgramDrafter`` holds the free sources (``chatapp.drafters.sources``): the n-gram lookup
(``LookupSource``), the speculative edits (``EditsSource`` over ``chatapp.drafters.edits``), the
history-wide suffix index (``chatapp.drafters.suffix``) and, for a reply whose hints carry one,
the predicted output (``chatapp.drafters.prediction``). It feeds each the context's tokens
(``append``), asks each for a proposal and drafts the first candidate of
``chatapp.drafters.sources.ranked`` whose kind the policy gives a budget. All are free and
one-hot, so verification stays exact at any temperature.

Prompt lookup (``LookupSource`` over an ``NgramIndex``): the continuation of the most recent
earlier occurrence of the longest suffix of the context (n-gram sizes ``min_n..max_n``, longest
first). The index maps every n-gram to the end of its most recent occurrence that has a
continuation. The sources are extended with the tokens appended since the last call (O(new
tokens x sizes)), and rebuilt only when the context is not an extension of what they have seen
(a new conversation, an edited one): checked in full at each reply's ``prefill``; within a reply
the engine's contexts extend each other, as the ``Drafter`` contract says.

Because the proposals cost nothing, the drafter can also tell how they would have fared: it
replays "speculate with ``lookahead`` tokens at every step" for each source over the tokens that
were emitted (``ShadowReplay``) and returns each would-be step as a ``ShadowScore`` from
``score_emitted``, which the engine calls after every step and passes to the policy with the
step's outcome, even while the policy is not drafting. Matching
a token the target emitted is an unbiased draw of the acceptance of a one-hot proposal (the
target emitted x with probability p(x), which is the acceptance probability), so the policy
learns the true acceptance rate at K = 0 and switches back on as soon as the text starts
repeating (code being edited, a quoted passage).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from chatapp.drafters.edits import EditTracker
from chatapp.drafters.prediction import PredictionSource
from chatapp.drafters.sources import NOTHING, Candidate, Source, agree, ranked
from chatapp.drafters.suffix import SuffixSource
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


class LookupSource:
    """The n-gram lookup as a ``Source``: ``NgramIndex.search`` over the context, under a kind
    that says how long the matched n-gram was and how the latest scored proposal fared."""

    def __init__(self, min_n: int = 1, max_n: int = 4, kind: str = NGRAM_KIND,
                 by_context: bool = True) -> None:
        self.index = NgramIndex(min_n, max_n)
        self.kind = kind
        self.by_context = by_context
        self.streak = "cold"  # how the latest scored proposal fared: hot (all), warm, cold (none)

    def restart(self) -> None:
        """The context starts over: an empty index (the streak stays)."""
        self.index = NgramIndex(self.index.min_n, self.index.max_n)

    def append(self, token: int) -> None:
        self.index.append(token)

    def propose(self, context: Sequence[int], k: int) -> Candidate:
        """Up to ``k`` tokens of n-gram lookup (``context`` is what was appended).

        With ``by_context`` the kind says how long the matched n-gram is ("long": at least
        ``LONG_MATCH`` tokens) and how the latest scored proposal fared ("hot": all of it matched,
        "warm": some, "cold": none), e.g. "ngram-long-hot". Acceptance comes in runs (code being
        copied, then an edit, then prose), so the policy learns how far to trust a proposal in
        each case instead of one average (in the code-editing prompts of the bench, the first
        token of a long match right after a fully matched proposal is right about 85% of the
        time, that of a short match after a miss about 45%)."""
        tokens, n = self.index.search(k)
        if not self.by_context:
            return Candidate(tokens, self.kind)
        return Candidate(tokens, f"{self.kind}-{'long' if n >= LONG_MATCH else 'short'}-"
                                 f"{self.streak}")

    def scored(self, score: ShadowScore) -> None:
        """Its latest would-be proposal scored ``score``: the streak of the next kinds."""
        self.streak = ("hot" if score.matched == score.proposed
                       else ("warm" if score.matched else "cold"))


class EditsSource:
    """The speculative edits (``EditTracker``) as a ``Source``."""

    def __init__(self, ends_line: Callable[[int], bool] | None = None) -> None:
        self.tracker = EditTracker(ends_line=ends_line)

    def append(self, token: int) -> None:
        self.tracker.append(token)

    def propose(self, context: Sequence[int], k: int) -> Candidate:
        tokens, kind = self.tracker.propose(k)
        return Candidate(tokens, kind)


@dataclass
class _Pending:
    """A would-be proposal still being scored: made at ``at``, ``counted`` positions told."""

    at: int
    proposal: list[int]
    kind: str
    counted: int = 0

    def rest(self, tokens: Sequence[int]) -> list[int]:
        """The part of the proposal after the emitted ``tokens`` while every token emitted since
        it was made matched it (empty once one did not, or before its scores caught up)."""
        if self.at + self.counted != len(tokens):
            return []
        return self.proposal[self.counted:]

    def settle(self, tokens: Sequence[int]) -> tuple[ShadowScore | None, bool]:
        """What the emitted ``tokens`` newly decided of it (None: nothing new), and whether
        that decided it whole (a mismatch or its end)."""
        known = len(tokens) - self.at
        matched = 0
        while (matched < min(known, len(self.proposal))
               and tokens[self.at + matched] == self.proposal[matched]):
            matched += 1
        counted = self.counted
        if matched < len(self.proposal) and matched == known:  # every emitted token matched
            if matched == counted:
                return None, False
            self.counted = matched
            return ShadowScore(self.kind, len(self.proposal), matched, counted, False), False
        self.counted = matched
        return ShadowScore(self.kind, len(self.proposal), matched, counted), True


class ShadowReplay:
    """One source's would-be speculation at every step, replayed over the emitted tokens.

    While idle, the next step would have proposed what the source proposes there; that proposal
    is scored as the tokens arrive (``settle``) until a mismatch or its end decides it, and the
    step after it starts the next.

    ``rungs``: the source's kinds are rungs of one cursor's run (the edits', a prediction's:
    "edit-new", "edit-run", "edit-run-long" as the copy grows). Then, while proposals are
    pending, a step where the source would propose a rung none of them has starts one more, so
    that each rung is judged on the steps where the source offers it; else a copy growing
    through the rungs would score only the rung it started on, and every longer rung would
    draft on the prior alone. (A lookup's or the suffix index's kinds are other matches, not
    one growing: theirs stay one proposal at a time.)"""

    def __init__(self, source: Source, lookahead: int, at: int = 0, rungs: bool = False) -> None:
        self.source = source
        self.lookahead = lookahead
        self.rungs = rungs
        self.at = at  # where the next proposal starts while none is pending
        self.pending: list[_Pending] = []

    def start_if_due(self, context: Sequence[int]) -> None:
        """Make the would-be proposal of a step starting after ``context``, if one starts
        there."""
        if self.pending:
            if self.rungs:
                candidate = self.source.propose(context, self.lookahead)
                if candidate.tokens and all(p.kind != candidate.kind for p in self.pending):
                    self.pending.append(_Pending(len(context), candidate.tokens, candidate.kind))
        elif len(context) == self.at:
            candidate = self.source.propose(context, self.lookahead)
            if candidate.tokens:
                self.pending.append(_Pending(len(context), candidate.tokens, candidate.kind))
            else:
                self.at += 1  # no proposal: that step would have been plain

    def settle(self, tokens: Sequence[int]) -> list[ShadowScore]:
        """What the emitted ``tokens`` newly decided of the pending proposals: the final score
        of each that a mismatch or its end decided, partial ones for the positions that matched
        since the last score."""
        scores, still = [], []
        for pending in self.pending:
            score, decided = pending.settle(tokens)
            if score is not None:
                scores.append(score)
            if decided:  # the target's own token follows the accepted ones
                self.at = max(self.at, pending.at + pending.counted + 1)
            else:
                still.append(pending)
        self.pending = still
        return scores

    def vouch(self, candidate: Candidate, tokens: Sequence[int]) -> Candidate:
        """``candidate`` (the source's live proposal after ``tokens``) also under the kind of
        each pending would-be proposal that every emitted token so far matched and that it
        continues: it is the same run, and that kind's record is the one its scores are
        building (a lookup's run that began as a short match turns into a long one as it
        grows, under a kind with no record of its own)."""
        kinds = [pending.kind for pending in self.pending
                 if pending.kind not in candidate.kinds
                 and agree(pending.rest(tokens), candidate.tokens)]
        if not kinds:
            return candidate
        return Candidate(candidate.tokens, candidate.kind, (*candidate.also, *dict.fromkeys(kinds)))


@dataclass(frozen=True)
class Lookaheads:
    """How far ahead each source's replay looks: the lookup, the edits (and a prediction), the
    suffix index."""

    lookup: int = LONGEST_FREE_DRAFT
    edits: int = LONGEST_FREE_DRAFT
    suffix: int = LONGEST_FREE_DRAFT


class NgramDrafter:
    """The free sources together; see the module docstring. Implements ``Drafter``.

    ``edits``: with the speculative edits; ``suffix``: the history-wide suffix index (None:
    without); ``ends_line``: which tokens end a line (the edits' line-by-line re-join);
    ``lookaheads``: each source's replay look-ahead for the policy's shadow scores."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4,
                 kind: str = NGRAM_KIND, kind_by_context: bool = True, edits: bool = True,
                 suffix: SuffixSource | None = None,
                 ends_line: Callable[[int], bool] | None = None,
                 lookaheads: Lookaheads = Lookaheads()) -> None:
        self.vocab_size = vocab_size
        self.suffix = suffix
        self.lookaheads = lookaheads
        self._edits = edits
        self._ends_line = ends_line
        self._lookup = LookupSource(min_n, max_n, kind, kind_by_context)
        self._tracker = self._new_edits()
        self.prediction: PredictionSource | None = None  # the reply's, from its prefill on
        self._scores: list[ShadowScore] = []  # settled since the last score_emitted
        self._replays = self._new_replays(0)

    @property
    def name(self) -> str:
        return "ngram"

    @property
    def context(self) -> list[int]:
        """Every token the sources were fed."""
        return self._lookup.index.tokens

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        """A reply starts: the suffix index follows the hints' document
        (``SuffixSource.follow``), every source is fed ``context`` (all anew unless it extends
        what they saw), and the predicted output (``hints.predicted``) becomes a source until
        the next ``prefill``."""
        if self.suffix is not None:
            self.suffix.follow(hints)
        known = len(self.context)
        if not (len(context) >= known and list(context[:known]) == self.context):
            self._restart()
        self.prediction = PredictionSource(
            hints.predicted, len(context) + 1, self._ends_line, at=len(self.context)) if (
            hints.predicted) else None
        self.sync(context, score=False)
        if self._tracker is not None:
            self._tracker.tracker.start_reply()  # a new reply: its own edits

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Nothing: the sources hold emitted tokens only, never drafts."""

    def close(self) -> None:
        """Nothing to free: no model."""

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.sync(context, score=True)
        return self.proposal(self.choose(budget))

    def choose(self, budget: DraftBudget) -> Candidate:
        """The candidate to draft after the last ``sync``: the first ranked one with a budget
        above 0, cut to it, under whichever of its kinds has the largest budget."""
        for candidate in self.candidates(budget.most):
            kind = max(candidate.kinds, key=budget.for_source)
            tokens = candidate.tokens[:budget.for_source(kind)]
            if tokens:
                return Candidate(tokens, kind)
        return NOTHING

    def candidates(self, k: int) -> list[Candidate]:
        """Every source's proposal of up to ``k`` tokens, ranked (``ranked``), each also under
        the kinds of its source's would-be proposals that it continues while they match
        (``ShadowReplay.vouch``)."""
        context = self.context
        proposals = []
        for source in (self.prediction, self._tracker, self.suffix, self._lookup):
            candidate = source.propose(context, k) if source is not None else NOTHING
            replay = next((replay for replay in self._replays if replay.source is source), None)
            if replay is not None and candidate.tokens:
                candidate = replay.vouch(candidate, context)
            proposals.append(candidate)
        return ranked(*proposals)

    def proposal(self, candidate: Candidate) -> Proposal:
        """``candidate`` as a one-hot proposal."""
        if not candidate.tokens:
            return Proposal.empty(self.vocab_size)
        return Proposal.one_hot(candidate.tokens, self.vocab_size, candidate.kind)

    def score_emitted(self, context: Sequence[int]) -> tuple[ShadowScore, ...]:
        """Feed ``context`` (``sync``, scoring) and hand over the shadow scores settled since
        the last call."""
        self.sync(context, score=True)
        scores = tuple(self._scores)
        self._scores.clear()
        return scores

    def sync(self, context: Sequence[int], score: bool) -> None:
        """Feed every source the tokens of ``context`` not seen yet (all anew if it does not
        end as what they saw: the contract has the engine's contexts extend each other within a
        reply); with ``score``, replay each source's speculation over them and keep how it would
        have fared for the next proposal's ``scores``."""
        known = len(self.context)
        if not known or len(context) < known or context[known - 1] != self.context[-1]:
            self._restart()
            known = 0
        seen, sources = self.context, self._sources()
        for position in range(known, len(context)):
            if score:
                for replay in self._replays:
                    replay.start_if_due(seen)
            token = context[position]
            for source in sources:
                source.append(token)
            if score:
                self._settle()
        if not score:  # nothing replayed: start replaying from here next time
            self._replays = self._new_replays(len(seen))

    def _restart(self) -> None:
        """The context is not an extension of what the sources saw: start them over."""
        self._lookup.restart()
        self._tracker = self._new_edits()
        self._replays = self._new_replays(0)
        if self.prediction is not None:
            self.prediction.restart()
        if self.suffix is not None:
            self.suffix.reset()  # the context is the open chat's whole text

    def _sources(self) -> list[Source]:
        """The sources fed every token: the lookup, the edits, the suffix index, a prediction."""
        optional = [self._tracker, self.suffix, self.prediction]
        return [self._lookup, *(source for source in optional if source is not None)]

    def _new_edits(self) -> EditsSource | None:
        return EditsSource(self._ends_line) if self._edits else None

    def _settle(self) -> None:
        """Keep the scores the latest token decided; the lookup's sets its streak."""
        for replay in self._replays:
            for scored in replay.settle(self.context):
                self._scores.append(scored)
                if replay.source is self._lookup and scored.settled:
                    self._lookup.scored(scored)

    def _new_replays(self, at: int) -> list[ShadowReplay]:
        """A replay per source, from position ``at``: the lookup, the edits, the suffix index,
        the predicted output."""
        ahead = self.lookaheads
        replays = [ShadowReplay(self._lookup, ahead.lookup, at)]
        if self._tracker is not None:
            replays.append(ShadowReplay(self._tracker, ahead.edits, at, rungs=True))
        if self.suffix is not None:
            replays.append(ShadowReplay(self.suffix, ahead.suffix, at))
        if self.prediction is not None:
            replays.append(ShadowReplay(self.prediction, ahead.edits, at, rungs=True))
        return replays
