"""Speculative edits: draft the reply from the source it is rewriting.

A code edit (a rename, a replaced call, an added argument) is the source again with small changes
on many lines, so an n-gram lookup keeps losing its match at every change. ``EditTracker`` instead
keeps a cursor into the source (an earlier span of the context, typically the code in the user's
message) and follows the reply through it token by token:

- synced: the reply's token is the one the cursor predicted; the cursor moves on.
- diverged: the reply wrote something else. The tracker looks for where the reply re-joins the
  source, within ``window`` tokens ahead of where they parted (the candidate whose preceding
  tokens match the reply's latest ones best, the nearest of equals). Until then it guesses once
  that the token was replaced one for one ("step past" it); after that it proposes nothing, and
  after ``patience`` tokens without re-joining it drops the cursor. A cursor that had matched
  ``CONFIDENT_RUN`` tokens moves to another part of the context meanwhile only on a match of
  ``LEAVE_MATCH`` tokens: a short one (the instruction quoting the new code, ``timeout=10.0``)
  must not take it out of the code it follows.
- line by line: given which tokens end a line (``ends_line``), a reply that diverged from a
  cursor that had matched ``LINE_ALIGNED`` tokens or more, and ends its line before re-joining
  on a match of two tokens or more, re-joins at the start of the next source line
  ("edit-line"): code is rewritten a line at a time, so the line after a changed
  one (a signature given type hints, a print made an f-string) is most likely the next line of
  the source, whatever the changed line ended with. A divergence at the start of both a source
  line and a reply line is taken for an inserted line: the reply re-joins that same source line.
- no cursor: it acquires one where the reply's last ``acquire_n`` tokens occurred before (among
  the latest occurrences, the one preceded by the longest match).

When the reply re-joins, what it wrote in place of the skipped source span is a substitution
(source ``A`` -> reply ``B``; an insertion is keyed by the two tokens before it and the one
after, and by the one after alone: a parameter added before every ``):``); it is learnt once
``CONFIRM`` tokens after the re-join match too, and applied wherever the source has ``A`` again
(once ``items`` became ``entries``, every later ``items`` is proposed as ``entries``). A
substitution the reply contradicts is forgotten.

Proposals are a deterministic function of the context, so they are one-hot and verification
stays exact at any temperature. Every update is O(1) per appended token (dictionary look-ups and
a bounded scan), independent of the context length; a proposal of k tokens costs O(k).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

EDIT_KIND = "edit"
EDIT_RUN = f"{EDIT_KIND}-run"  # the kind of a confident cursor's proposal
EDIT_LONG_RUN = f"{EDIT_RUN}-long"  # ... and of one in a long verbatim stretch
EDIT_LINE = f"{EDIT_KIND}-line"  # ... and of one re-joined at the next line, not yet confident
CONFIDENT_RUN = 4  # tokens matched since the last re-join for a cursor to count as confident
LONG_RUN = 12  # tokens matched since the last re-join for a run to count as long (the n-gram
# length llama.cpp's ngram-simple requires before it drafts: a stretch copied that far tends to
# go on, so the policy learns this kind apart and may draft it longer)
CONFIRM = 2  # tokens that must match after a re-join before its substitution is learnt
MAX_SUBST = 8  # longest source or reply span of a learnt substitution
LINE_ALIGNED = 2  # tokens a cursor must have matched for the line-by-line re-join after it leaves
LEAVE_MATCH = 8  # a diverged cursor moves elsewhere only for a match this long (else re-joins)


@dataclass
class _Cursor:
    """Where the reply stands in the source: the next source position ``pos``, the rest of a
    substitution being written (``pending``, replacing ``source[sub_start:pos]``), and how many
    reply tokens have matched since the cursor was last placed (``run``)."""

    pos: int
    pending: tuple[int, ...] = ()
    sub_start: int = 0
    run: int = 0
    by_line: bool = False  # placed at a line start by the line-by-line re-join


@dataclass(frozen=True)
class _Divergence:
    """The reply left the source at source position ``source_at`` with its token at context
    position ``reply_at``; ``source_end`` is where the re-join must be found by."""

    source_at: int
    reply_at: int
    source_end: int
    settled: bool = False  # the cursor had matched CONFIDENT_RUN tokens or more before it
    line_start: int | None = None  # where the reply re-joins once it ends its line, if known


class EditTracker:
    """Follows a growing token sequence through the earlier span it rewrites; see the module
    docstring. Feed every token with ``append``; ``propose`` never changes the state."""

    def __init__(self, window: int = 48, patience: int = 12, acquire_n: int = 3,
                 candidates: int = 8, ends_line: Callable[[int], bool] | None = None) -> None:
        """``ends_line``: whether a token ends a line (its text holds a newline); without it the
        tracker does not follow the text line by line."""
        if acquire_n < 2:
            raise ValueError(f"acquire_n must be at least 2, got {acquire_n}")
        self.window = window
        self.ends_line = ends_line
        self.patience = patience
        self.acquire_n = acquire_n
        self.candidates = candidates
        self.tokens: list[int] = []
        self._positions: dict[int, list[int]] = {}  # token -> its positions, ascending
        self._grams: dict[tuple[int, ...], list[int]] = {}  # acquire_n-gram -> ends, ascending
        self._subs: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}  # first token -> A -> B
        # (2 before, 1 after) or (1 after,) -> inserted tokens
        self._inserts: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._cursor: _Cursor | None = None
        self._lost: _Divergence | None = None
        self._rejoined: _Divergence | None = None  # the divergence of a re-join not yet confirmed
        self._candidate: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def start_reply(self) -> None:
        """Drop the learnt substitutions and what the line-by-line following made of the prompt:
        at the start of a reply, the substitutions seen in the prompt are not the edit being made,
        and the line the prompt's own text left says nothing of where the reply starts."""
        self._subs.clear()
        self._inserts.clear()
        self._candidate = None
        self._rejoined = None
        if self._lost is not None:
            self._lost = replace(self._lost, line_start=None)
        if self._cursor is not None and self._cursor.by_line:
            self._cursor = self._lost = None

    @property
    def following(self) -> bool:
        """Whether a cursor is placed (synced, or diverged and looking for the re-join)."""
        return self._cursor is not None

    def unfollow(self) -> None:
        """Drop the cursor: follow nothing until the sequence is acquired again or
        ``follow_from`` places one."""
        self._cursor, self._lost, self._rejoined, self._candidate = None, None, None, None

    def follow_from(self, pos: int) -> None:
        """Expect the sequence to go on from ``pos`` (``chatapp.drafters.prediction``)."""
        self.unfollow()
        self._cursor = _Cursor(pos)

    # -- proposing ------------------------------------------------------------------------------

    def propose(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` tokens the reply is expected to continue with, and their kind: "edit-run"
        (the cursor has matched ``CONFIDENT_RUN`` tokens or more), "edit-new" (fewer), or
        "edit-step" (a guess right after a divergence); "edit-run-long" once the run reaches
        ``LONG_RUN``; "edit-line" instead of "edit-new" after a line-by-line re-join. Empty when
        there is no alignment."""
        cursor = self._cursor
        if cursor is None or k <= 0:
            return [], EDIT_KIND
        if self._lost is not None:
            if len(self.tokens) - self._lost.reply_at != 1:
                return [], EDIT_KIND
            # one token replaced by another: guess that it is replaced where it recurs after
            # the same token
            at = self._lost.source_at
            guess = (self.tokens[at - 1], self.tokens[at], self.tokens[self._lost.reply_at])
            return self._continuation(cursor, k, guess), f"{EDIT_KIND}-step"
        return self._continuation(cursor, k), _run_kind(cursor)

    def _continuation(self, cursor: _Cursor, k: int,
                      guess: tuple[int, int, int] | None = None) -> list[int]:
        """The source from ``cursor`` with the learnt substitutions applied, up to ``k`` tokens;
        ``guess`` (before, old, new): also replace ``old`` by ``new`` where it follows
        ``before``."""
        out = list(cursor.pending[:k])
        tokens, pos, end = self.tokens, cursor.pos, len(self.tokens)
        while len(out) < k and pos < end:
            span, replacement = self._substitution_at(pos)
            if not span and guess is not None and (tokens[pos - 1], tokens[pos]) == guess[:2]:
                span, replacement = 1, guess[2:]
            if span:
                out.extend(replacement)
                pos += span
            else:
                out.append(tokens[pos])
                pos += 1
        return out[:k]

    def _substitution_at(self, pos: int) -> tuple[int, tuple[int, ...]]:
        """(length of the source span a learnt substitution replaces at ``pos``, its non-empty
        replacement), or (0, ()). An insertion before ``pos`` is returned as replacing the token
        at ``pos`` by the inserted tokens and that token."""
        tokens = self.tokens
        inserted = (self._inserts.get(tuple(tokens[pos - 2:pos + 1])) if pos >= 2 else None
                    ) or self._inserts.get((tokens[pos],))
        subs = self._subs.get(tokens[pos])
        if subs:
            for source, replacement in subs.items():
                n = len(source)
                if tuple(tokens[pos:pos + n]) == source:
                    return n, (inserted or ()) + replacement
        if inserted:
            return 1, inserted + (tokens[pos],)
        return 0, ()

    # -- following the sequence -----------------------------------------------------------------

    def append(self, token: int) -> None:
        """Add the next token of the sequence and move the cursor accordingly."""
        if self._lost is None and self._cursor is not None:
            self._follow(self._cursor, token)
        if self._lost is not None:
            self._rejoin(token)
        elif self._cursor is None:
            self._acquire(token)
        self._index(token)

    def _follow(self, cursor: _Cursor, token: int) -> None:
        """A token while synced: advance on a match, else diverge."""
        tokens, at = self.tokens, len(self.tokens)
        if cursor.pending:
            if cursor.pending[0] == token:
                cursor.pending = cursor.pending[1:]
                self._matched(cursor)
                return
            self._forget_substitution(cursor.sub_start, cursor.pos)
            self._diverge(cursor.sub_start, at)
            return
        if cursor.pos >= at:
            self._cursor = None  # ran into the sequence's own end: nothing left to follow
            return
        span, replacement = self._substitution_at(cursor.pos)
        if span and replacement[0] == token:
            cursor.sub_start, cursor.pos = cursor.pos, cursor.pos + span
            cursor.pending = replacement[1:]
            self._matched(cursor)
        elif tokens[cursor.pos] == token:
            if span:  # the reply kept the source as it was: that substitution does not hold
                self._forget_substitution(cursor.pos, cursor.pos + span)
            cursor.pos += 1
            self._matched(cursor)
        else:
            if span:
                self._forget_substitution(cursor.pos, cursor.pos + span)
            self._diverge(cursor.pos, at)

    def _matched(self, cursor: _Cursor) -> None:
        cursor.run += 1
        self._rejoined = None
        if self._candidate is not None and cursor.run >= CONFIRM:  # the re-join held: learn it
            source, replacement, around = self._candidate
            if source:
                self._subs.setdefault(source[0], {})[source] = replacement
            else:
                self._inserts[around] = self._inserts[around[-1:]] = replacement
            self._candidate = None

    def _diverge(self, source_at: int, reply_at: int) -> None:
        self._candidate = None
        if self._rejoined is not None and self._cursor is not None and self._cursor.run == 0:
            self._lost, self._rejoined = self._rejoined, None  # that re-join was a coincidence
            return
        run = self._cursor.run if self._cursor is not None else 0
        line_start = self._line_to_rejoin(source_at, reply_at) if run >= LINE_ALIGNED else None
        self._lost = _Divergence(source_at, reply_at, source_at + self.window,
                                 run >= CONFIDENT_RUN, line_start)
        self._cursor = _Cursor(source_at + 1)  # the one-for-one guess, for the next token

    def _line_to_rejoin(self, source_at: int, reply_at: int) -> int | None:
        """Where a reply that left the source at ``source_at`` (its own token at ``reply_at``)
        re-joins it once it ends its line: that source line's start if both were at a line
        start (an inserted line), else the start of the next source line within ``window``;
        None without ``ends_line`` or a line end in reach."""
        ends_line, tokens = self.ends_line, self.tokens
        if ends_line is None or source_at < 1:
            return None
        if ends_line(tokens[source_at - 1]) and ends_line(tokens[reply_at - 1]):
            return source_at
        for p in range(source_at, min(source_at + self.window, reply_at)):
            if ends_line(tokens[p]):
                return p + 1
        return None

    def _rejoin(self, token: int) -> None:
        """A token while diverged: re-join the source where the reply's latest tokens match it
        (or, when the token ends the reply's line, at the line to re-join), keep the one-for-one
        guess for one token, or give up after ``patience`` tokens (``window`` while a line to
        re-join is known)."""
        lost, tokens = self._lost, self.tokens
        assert lost is not None
        at = len(tokens)
        written = at + 1 - lost.reply_at  # reply tokens since the divergence, this one included
        best, best_match = -1, 0
        positions = self._positions.get(token, ()) if written >= 2 else ()
        # from the token before the divergence: inserted lines end as the line before them did
        first = bisect_left(positions, lost.source_at - 1)
        for p in positions[first:first + self.candidates]:
            if p >= lost.source_end:
                break
            match = 1
            while (match < written and p - match >= lost.source_at
                   and tokens[p - match] == tokens[at - match]):
                match += 1
            if match > best_match:
                best, best_match = p, match
        if best_match < 2 and best + 1 != lost.line_start and self._ends_reply_line(token, lost):
            assert lost.line_start is not None
            self._rejoin_at(lost, lost.line_start, lost.line_start,
                            (*tokens[lost.reply_at:at], token), by_line=True)
        elif best >= 0:
            rewritten = best == lost.source_at - 1  # the reply wrote that token again
            self._rejoin_at(lost, best + 1, best + 1 - best_match,
                            tuple(tokens[lost.reply_at:at + 1 - best_match + rewritten]))
        elif written >= 2 and self._acquire(
                token, LEAVE_MATCH if lost.settled or lost.line_start is not None else 0):
            self._lost = None  # the reply went on with another part of the context
        elif written > (self.window if lost.line_start is not None else self.patience):
            self._lost, self._cursor = None, None

    def _rejoin_at(self, lost: _Divergence, pos: int, source_end: int,
                   replacement: tuple[int, ...], by_line: bool = False) -> None:
        """Re-join the source with the cursor at ``pos``; ``replacement``, what the reply wrote
        since ``lost``, stands in place of the source up to ``source_end``: a substitution to
        learn once the re-join is confirmed, if both are short."""
        tokens = self.tokens
        self._lost, self._rejoined = None, lost
        self._cursor = _Cursor(pos, by_line=by_line)
        source = tuple(tokens[lost.source_at:source_end])
        if replacement and len(source) <= MAX_SUBST and len(replacement) <= MAX_SUBST and (
                lost.source_at >= 2):
            around = tuple(tokens[lost.source_at - 2:lost.source_at + 1])
            self._candidate = (source, replacement, around)

    def _ends_reply_line(self, token: int, lost: _Divergence) -> bool:
        """Whether ``token`` ends the reply's line after it left the source at ``lost`` (and the
        line-by-line re-join applies: ``lost.line_start`` is known)."""
        written = len(self.tokens) + 1 - lost.reply_at
        return (lost.line_start is not None and written >= 2 and self.ends_line is not None
                and self.ends_line(token))

    def _acquire(self, token: int, min_match: int = 0) -> bool:
        """Place the cursor after the best earlier occurrence of the last ``acquire_n`` tokens
        (``token`` the last of them), if it is preceded by a match of ``min_match`` tokens or
        more; False if there is none."""
        n, tokens = self.acquire_n, self.tokens
        if len(tokens) < n - 1:
            return False
        key = tuple(tokens[len(tokens) - n + 1:]) + (token,)
        ends = self._grams.get(key)
        if not ends:
            return False
        at = len(tokens)  # this token's position; a candidate end e covers tokens[e-n:e]
        best, best_match = -1, 0
        for end in reversed(ends[-self.candidates:]):
            match = n
            while match < 4 * n and end - 1 - match >= 0 and (
                    tokens[end - 1 - match] == tokens[at - match]):
                match += 1
            if match > best_match:
                best, best_match = end, match
        if best_match < min_match:
            return False
        self._cursor, self._rejoined = _Cursor(best), None
        return True

    def _forget_substitution(self, start: int, end: int) -> None:
        tokens = self.tokens
        source = tuple(tokens[start:end])
        if source:
            self._subs.get(source[0], {}).pop(source, None)
        if start >= 2:
            self._inserts.pop(tuple(tokens[start - 2:start + 1]), None)
        if start < len(tokens):
            self._inserts.pop((tokens[start],), None)

    def _index(self, token: int) -> None:
        tokens = self.tokens
        tokens.append(token)
        at = len(tokens) - 1
        self._positions.setdefault(token, []).append(at)
        n = self.acquire_n
        if at >= n:  # the n-gram before this token has this token as its continuation
            self._grams.setdefault(tuple(tokens[at - n:at]), []).append(at)


def _run_kind(cursor: _Cursor) -> str:
    """The kind of a proposal from ``cursor``, by how many tokens it has matched since it was
    last placed and how it was placed."""
    if cursor.run >= LONG_RUN:
        return EDIT_LONG_RUN
    if cursor.run >= CONFIDENT_RUN:
        return EDIT_RUN
    return EDIT_LINE if cursor.by_line else f"{EDIT_KIND}-new"


def line_end_test(token_bytes: Callable[[int], bytes]) -> Callable[[int], bool]:
    """Whether a token ends a line (its bytes hold a newline), remembered per token."""
    @lru_cache(maxsize=None)
    def ends_line(token: int) -> bool:
        return b"\n" in token_bytes(token)
    return ends_line
