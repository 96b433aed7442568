"""Drafters besides the plain draft model: prompt lookup (n-gram), n-gram then model, and a model
drafter that only touches the draft model when it is asked to draft.

``NgramDrafter`` (prompt-lookup decoding): the continuation of the most recent earlier occurrence
of the longest suffix of the context (n-gram sizes ``min_n..max_n``, longest first). It costs no
model call. Its proposal is deterministic given the context, so its distribution is one-hot and
verification stays exact at any temperature (acceptance probability p(x)). The index maps every
n-gram to the end of its most recent occurrence that has a continuation; it is extended with the
tokens appended since the last call (O(new tokens x sizes)), and rebuilt only when the context is
not an extension of what it has seen (a new conversation, an edited one).

Because its proposals cost nothing, it can also tell how they would have fared: it replays
"speculate with ``lookahead`` n-gram tokens at every step" over the tokens that were emitted and
reports each would-be step to an ``AutoDraftLength`` (``observe_shadow``), even while the policy
is not drafting. Matching a token the target emitted is an unbiased draw of the acceptance of a
one-hot proposal (the target emitted x with probability p(x), which is the acceptance probability),
so the policy learns the true acceptance rate at K = 0 and switches back on as soon as the text
starts repeating (code being edited, a quoted passage).

``NgramModelDrafter`` ("ngram+model"): the n-gram proposal when there is a match, else the draft
model. With an ``AutoDraftLength`` as advisor each source has its own acceptance and cost
statistics, so on a machine where the draft model does not pay the policy turns the model off and
keeps the n-gram.

``DeferredModelDrafter``: a ``ModelDrafter`` whose ``prefill`` evaluates nothing; the draft model
catches up on the first proposal (``evaluate_sequence`` feeds whatever it lacks in one batch).
When the policy decides not to draft, the draft model never evaluates the prompt at all. Its
cache still never holds tokens that are not in the conversation: ``prefill`` drops whatever the
new context no longer shares (a new chat, an edited message).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from chatapp.drafting import ModelDrafter, Proposal, one_hot_rows, rollback_to_prefix
from chatapp.edit_drafter import EDIT_RUN, EditTracker
from chatapp.sampling import SamplingParams
from chatapp.suffix_drafter import SuffixSource
from chatapp.suffix_index import SUFFIX_LONG

NGRAM_KIND = "ngram"
LONG_MATCH = 3  # an n-gram match this long or longer is a "long" match
MODEL_KIND = "model"


class Advisor(Protocol):
    """What drafters use of ``chatapp.draft_policy.AutoDraftLength``."""

    def advising(self) -> bool: ...

    def k_for(self, kind: str, k: int) -> int: ...

    def observe_shadow(self, kind: str, proposed: int, matched: int) -> None: ...


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


class ShadowReplay:
    """One source's would-be speculation at every step, replayed over the emitted tokens: at
    ``at`` it would have proposed ``proposal`` (of ``kind``); ``settle`` scores it."""

    def __init__(self, at: int = 0) -> None:
        self.at = at
        self.proposal: list[int] = []
        self.kind = ""

    def due(self, position: int) -> bool:
        """True when a would-be step starts at ``position`` and needs its proposal (``start``)."""
        return position == self.at and not self.proposal

    def start(self, proposal: list[int], kind: str) -> None:
        self.proposal, self.kind = proposal, kind
        if not proposal:
            self.at += 1  # no proposal: that step would have been plain

    def settle(self, tokens: Sequence[int], advisor: Advisor) -> tuple[int, int] | None:
        """Report the pending proposal to ``advisor`` once the emitted ``tokens`` decide it;
        returns (proposed, matched) when reported, None while undecided or idle."""
        proposal, start = self.proposal, self.at
        if not proposal:
            return None
        known = len(tokens) - start
        matched = 0
        while matched < min(known, len(proposal)) and tokens[start + matched] == proposal[matched]:
            matched += 1
        if matched < len(proposal) and matched == known:
            return None  # every emitted token so far matched; wait for more
        advisor.observe_shadow(self.kind, len(proposal), matched)
        self.at = start + matched + 1  # the target's own token follows the accepted ones
        self.proposal = []
        return len(proposal), matched


class NgramDrafter:
    """Prompt-lookup drafting; see the module docstring. Implements ``Drafter``.

    With ``edits`` (the default) an ``EditTracker`` comes first: while the reply follows a
    source it is rewriting, its proposal (up to ``k`` tokens) is used; then a ``suffix``
    source (the history-wide index, if given) when it is confident; the n-gram lookup
    otherwise. A "suffix-long" proposal (a long match, e.g. an earlier chat's reply being
    written again) comes before the edits unless the edits are in a confident run. Each source is replayed for the advisor under its own kinds (``lookahead``
    tokens for the lookup, ``edit_lookahead`` for the edits, ``suffix_lookahead`` for the
    suffix index)."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4, lookahead: int = 8,
                 advisor: Advisor | None = None, kind: str = NGRAM_KIND,
                 kind_by_context: bool = True, edits: bool = True,
                 edit_lookahead: int = 16, suffix: SuffixSource | None = None,
                 suffix_lookahead: int = 16) -> None:
        self.vocab_size = vocab_size
        self.min_n = min_n
        self.max_n = max_n
        self.lookahead = lookahead
        self.edit_lookahead = edit_lookahead
        self.suffix = suffix
        self.suffix_lookahead = suffix_lookahead
        self.advisor = advisor
        self.kind = kind
        self.kind_by_context = kind_by_context
        self.edits = edits
        self._index = NgramIndex(min_n, max_n)
        self._tracker = EditTracker() if edits else None
        self._seen: Any = None  # the context object last synced (the engine appends to it)
        self._shadow = ShadowReplay()  # the n-gram lookup's would-be speculation
        self._edit_shadow = ShadowReplay()  # the edit tracker's
        self._suffix_shadow = ShadowReplay()  # the suffix index's
        self._streak = "cold"  # how the latest scored proposal fared: hot (all), warm, cold (none)

    @property
    def name(self) -> str:
        return "ngram"

    def set_advisor(self, advisor: Advisor | None) -> None:
        self.advisor = advisor

    def prefill(self, context: Sequence[int]) -> None:
        self.sync(context, report=False)
        if self._tracker is not None:
            self._tracker.forget_substitutions()  # a new reply: its own edits

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Nothing: the index holds emitted tokens only, never drafts."""

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        advisor = self._active_advisor()
        self.sync(context, report=advisor is not None)
        tokens, _ = self.choose(k, advisor)
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size))

    def choose(self, k: int, advisor: Advisor | None) -> tuple[list[int], str]:
        """The proposal to draft after the last ``sync`` and its kind: the first source (edits,
        then the lookup) with a proposal that ``advisor`` (if any) gives a K > 0, cut to it."""
        for tokens, kind in self._candidates(k):
            if advisor is not None:
                tokens = tokens[:advisor.k_for(kind, len(tokens))]
            if tokens:
                return tokens, kind
        return [], self.kind

    def search(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` tokens continuing the context of the last ``sync``, and their kind: the
        edit tracker's proposal if it has one, else the n-gram lookup's (``lookup``)."""
        return next(iter(self._candidates(k)), ([], self.kind))

    def _candidates(self, k: int) -> Iterator[tuple[list[int], str]]:
        suffix = self.suffix.propose(self._index.tokens, k) if self.suffix is not None else ([], "")
        edit = self._tracker.propose(k) if self._tracker is not None else ([], "")
        first = suffix[1] == SUFFIX_LONG and edit[1] != EDIT_RUN  # else the edits come first
        for tokens, kind in ((suffix, edit) if first else (edit, suffix)):
            if tokens:
                yield tokens, kind
        tokens, kind = self.lookup(k)
        if tokens:
            yield tokens, kind

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

    def sync(self, context: Sequence[int], report: bool) -> None:
        """Index the tokens of ``context`` not seen yet (rebuild if it is not an extension);
        with ``report``, tell the advisor how replayed speculation of each source fared on
        them."""
        index = self._index
        known = len(index)
        extends = len(context) >= known and (
            (context is self._seen and (known == 0 or context[known - 1] == index.tokens[-1]))
            or list(context[:known]) == index.tokens)
        if not extends:
            self._index = index = NgramIndex(self.min_n, self.max_n)
            self._tracker = EditTracker() if self.edits else None
            self._shadow, self._edit_shadow = ShadowReplay(), ShadowReplay()
            self._suffix_shadow = ShadowReplay()
            known = 0
        if known == 0 and self.suffix is not None:
            self.suffix.reset()  # the context is the open chat's whole text
        self._seen = context
        advisor = self.advisor if report else None
        tracker, shadow, edit_shadow = self._tracker, self._shadow, self._edit_shadow
        suffix, suffix_shadow = self.suffix, self._suffix_shadow
        for position in range(known, len(context)):
            if advisor is not None:
                if shadow.due(position):
                    shadow.start(*self.lookup(self.lookahead))
                if tracker is not None and edit_shadow.due(position):
                    edit_shadow.start(*tracker.propose(self.edit_lookahead))
                if suffix is not None and suffix_shadow.due(position):
                    suffix_shadow.start(*suffix.propose(index.tokens, self.suffix_lookahead))
            token = context[position]
            index.append(token)
            if tracker is not None:
                tracker.append(token)
            if suffix is not None:
                suffix.append(token)
            if advisor is not None:
                scored = shadow.settle(index.tokens, advisor)
                if scored is not None:
                    proposed, matched = scored
                    self._streak = ("hot" if matched == proposed
                                    else ("warm" if matched else "cold"))
                edit_shadow.settle(index.tokens, advisor)
                suffix_shadow.settle(index.tokens, advisor)
        if not report:  # nothing replayed: start replaying from here next time
            self._shadow, self._edit_shadow = ShadowReplay(len(index)), ShadowReplay(len(index))
            self._suffix_shadow = ShadowReplay(len(index))

    def _active_advisor(self) -> Advisor | None:
        advisor = self.advisor
        return advisor if advisor is not None and advisor.advising() else None


class NgramModelDrafter:
    """"ngram+model": the n-gram proposal when there is one, else the draft model.

    With ``fill``, an n-gram proposal shorter than ``k`` is topped up by the model, drafting after
    the n-gram tokens. With an advisor, each source gets the K the advisor gives it (``k_for``),
    which may be 0; the model is used when the n-gram proposes nothing.
    """

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, fill: bool = False,
                 advisor: Advisor | None = None) -> None:
        self.ngram = ngram
        self.model = model
        self.fill = fill
        self.advisor = advisor
        ngram.set_advisor(advisor)

    @property
    def name(self) -> str:
        return f"ngram+{self.model.name}"

    @property
    def backend(self) -> Any:
        """The draft model's backend (the one with weights to free)."""
        return self.model.backend

    def set_advisor(self, advisor: Advisor | None) -> None:
        self.advisor = advisor
        self.ngram.set_advisor(advisor)

    def prefill(self, context: Sequence[int]) -> None:
        self.ngram.prefill(context)
        self.model.prefill(context)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        self.model.rollback(context, verified)

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        advisor = self.advisor if self.advisor is not None and self.advisor.advising() else None
        self.ngram.sync(context, report=advisor is not None)
        tokens, _ = self.ngram.choose(k, advisor)
        if tokens:
            probs = one_hot_rows(tokens, self.ngram.vocab_size)
            if not self.fill or len(tokens) >= k or tokens[-1] in self.model.backend.stop_ids:
                return Proposal(tokens, probs)
            more = self.model.propose(list(context) + tokens, k - len(tokens), params, rng)
            return Proposal(tokens + more.tokens, np.concatenate([probs, more.probs]))
        m = advisor.k_for(MODEL_KIND, k) if advisor is not None else k
        if m <= 0:
            return Proposal.empty(self.ngram.vocab_size)
        return self.model.propose(context, m, params, rng)


class DeferredModelDrafter(ModelDrafter):
    """A ``ModelDrafter`` that leaves the draft model alone until it is asked to draft."""

    def prefill(self, context: Sequence[int]) -> None:
        """Drop cached tokens ``context`` does not share; ``propose`` feeds the rest when needed."""
        rollback_to_prefix(self.backend, context)
