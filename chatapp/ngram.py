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
the policy, even while the policy is not drafting. Matching a token the target emitted is an unbiased draw of the acceptance of a
one-hot proposal (the target emitted x with probability p(x), which is the acceptance probability),
so the policy learns the true acceptance rate at K = 0 and switches back on as soon as the text
starts repeating (code being edited, a quoted passage).

``NgramModelDrafter`` ("ngram+model"): the n-gram proposal when there is a match, else the draft
model. Each source reports its own name, so the policy keeps acceptance and cost statistics per
source and, on a machine where the draft model does not pay, gives it a budget of 0 while keeping
the n-gram.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chatapp.drafting import (MODEL_SOURCE, DraftBudget, ModelDrafter, Proposal, ShadowScore,
                              one_hot_rows)
from chatapp.sampling import SamplingParams

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


class NgramDrafter:
    """Prompt-lookup drafting; see the module docstring. Implements ``Drafter``."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4, lookahead: int = 8,
                 kind: str = NGRAM_KIND, kind_by_context: bool = True) -> None:
        self.vocab_size = vocab_size
        self.min_n = min_n
        self.max_n = max_n
        self.lookahead = lookahead
        self.kind = kind
        self.kind_by_context = kind_by_context
        self._index = NgramIndex(min_n, max_n)
        self._seen: Any = None  # the context object last synced (the engine appends to it)
        self._shadow_at = 0  # where the replayed would-be speculation stands
        self._shadow: list[int] = []  # its pending proposal, made at _shadow_at
        self._shadow_kind = kind
        self._streak = "cold"  # how the latest scored proposal fared: hot (all), warm, cold (none)
        self._scores: list[ShadowScore] = []  # settled since the last proposal

    @property
    def name(self) -> str:
        return "ngram"

    def prefill(self, context: Sequence[int]) -> None:
        self.sync(context, score=False)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Nothing: the index holds emitted tokens only, never drafts."""

    def close(self) -> None:
        """Nothing to free: no model."""

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.sync(context, score=True)
        tokens, kind = self.search(budget.most)
        return self.proposal(tokens[:budget.for_source(kind)], kind)

    def proposal(self, tokens: list[int], kind: str) -> Proposal:
        """``tokens`` (from ``search``) as a one-hot proposal of ``kind``, with the shadow scores
        settled since the last proposal."""
        scores = tuple(self._scores)
        self._scores.clear()
        if not tokens:
            return Proposal.empty(self.vocab_size, scores)
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size), kind, scores)

    def search(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` tokens continuing the context of the last ``sync``, and their kind.

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
        """Index the tokens of ``context`` not seen yet (rebuild if it is not an extension);
        with ``score``, replay n-gram speculation over them and keep how it would have fared for
        the next proposal's ``scores``."""
        index = self._index
        known = len(index)
        extends = len(context) >= known and (
            (context is self._seen and (known == 0 or context[known - 1] == index.tokens[-1]))
            or list(context[:known]) == index.tokens)
        if not extends:
            self._index = index = NgramIndex(self.min_n, self.max_n)
            self._shadow_at, self._shadow = 0, []
            known = 0
        self._seen = context
        for position in range(known, len(context)):
            if score and position == self._shadow_at and not self._shadow:
                self._shadow, n = index.search(self.lookahead)
                self._shadow_kind = self._kind(n)
                if not self._shadow:
                    self._shadow_at += 1  # no match: that step would have been plain
            index.append(context[position])
            if score and self._shadow:
                self._settle_shadow()
        if not score:  # nothing replayed: start replaying from here next time
            self._shadow_at, self._shadow = len(index), []

    def _settle_shadow(self) -> None:
        """Score the pending would-be proposal as far as the emitted tokens allow."""
        tokens, start, proposal = self._index.tokens, self._shadow_at, self._shadow
        known = len(tokens) - start
        matched = 0
        while matched < min(known, len(proposal)) and tokens[start + matched] == proposal[matched]:
            matched += 1
        if matched < len(proposal) and matched == known:
            return  # every emitted token so far matched; wait for more
        self._scores.append(ShadowScore(self._shadow_kind, len(proposal), matched))
        self._streak = "hot" if matched == len(proposal) else ("warm" if matched else "cold")
        self._shadow_at = start + matched + 1  # the target's own token follows the accepted ones
        self._shadow = []


class NgramModelDrafter:
    """"ngram+model": the n-gram proposal when there is one, else the draft model.

    Each source drafts within its own budget, which may be 0; the model drafts when the n-gram
    proposes nothing. With ``fill``, an n-gram proposal shorter than the largest budget is topped
    up by the model, drafting after the n-gram tokens.
    """

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, fill: bool = False) -> None:
        self.ngram = ngram
        self.model = model
        self.fill = fill

    @property
    def name(self) -> str:
        return f"ngram+{self.model.name}"

    def prefill(self, context: Sequence[int]) -> None:
        self.ngram.prefill(context)
        self.model.prefill(context)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        self.model.rollback(context, verified)

    def close(self) -> None:
        self.model.close()

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.ngram.sync(context, score=True)
        found, kind = self.ngram.search(budget.most)
        proposal = self.ngram.proposal(found[:budget.for_source(kind)], kind)
        if proposal.tokens:
            return self._filled(context, proposal, budget.most, params, rng)
        drafted = self.model.draft(context, budget.for_source(MODEL_SOURCE), params, rng)
        return Proposal(drafted.tokens, drafted.probs, drafted.source, proposal.scores)

    def _filled(self, context: Sequence[int], proposal: Proposal, k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """With ``fill``, ``proposal`` topped up to ``k`` tokens by the model."""
        tokens = proposal.tokens
        if not self.fill or len(tokens) >= k or tokens[-1] in self.model.backend.stop_ids:
            return proposal
        more = self.model.draft(list(context) + tokens, k - len(tokens), params, rng)
        return Proposal(tokens + more.tokens, np.concatenate([proposal.probs, more.probs]),
                        proposal.source, proposal.scores)
