"""Draft proposals, the budget a policy gives a drafter, and keeping a backend's KV cache in step
with a token sequence.

A ``Proposal`` keeps what was proposed together with the distributions it was drawn from, so the
verifier always divides by the q that actually produced each token (a greedy or n-gram drafter
proposes with a one-hot q). It also says which source made it, so the engine can tell the policy,
and carries the would-be outcomes of proposals a free drafter scored on the emitted tokens.

One step, as the engine drives it: the policy gives a ``DraftBudget`` (how many tokens each source
may draft), the drafter proposes within it, the target verifies, and the engine reports the
outcome to the policy (``StepOutcome``). Drafters never call the policy.

What one reply tells the drafters travels as one value, ``DraftHints``, handed to
``SpeculativeEngine.generate`` and by the engine to ``Drafter.prefill``: the hints hold for that
reply only (the next reply's ``prefill`` brings its own), and no code above the engine calls a
drafter.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Protocol

import numpy as np

from chatapp.engine.sampling import SamplingParams

MODEL_SOURCE = "model"  # the draft model's proposals
PREDICTION_SOURCE = "prediction"  # the family of proposals from a reply's predicted output (an API
# client's ``prediction``): the client speaks for the reply, so a policy may carry what it learnt
# of them from one reply with a prediction to the next (other free sources start each reply anew)
LONGEST_FREE_DRAFT = 16  # the longest draft of a source that costs nothing to ask (a lookup, the
# edits, the suffix index), and how far ahead such a source scores itself. On the 2-core CPU of
# docs/benchmarks.md verifying 16 tokens costs about 7.5 decode steps, less than 15 or 17
# (llama.cpp's batched kernels work in blocks). 32 (13 steps there) was measured no better on the
# code-edit prompts and cost 4-6% in the policy simulation (tests/test_auto_simulation.py).


def source_family(kind: str) -> str:
    """The family of a proposal's kind: its name before the first "-" ("edit-run-long" ->
    "edit"); "" (a plain step, nothing drafted) -> "target"."""
    return kind.split("-", 1)[0] if kind else "target"


@dataclass(frozen=True)
class DraftBudget:
    """How many tokens each source may draft in one step: the policy's decision, as data.

    ``by_source`` names the sources the policy has a decision for; any other source gets
    ``default``. ``consult``: ask the drafter even when every budget is 0, because it scores its
    would-be proposals for free (an n-gram lookup) and the policy learns from that. ``cuts``:
    per source, how many tokens of a proposal of m tokens to verify (``cuts[source][m]``, see
    ``cut``), so that a source that runs out before its budget ends on a batch size that is
    cheap on this machine; ``default_cuts``: the same for the sources that get ``default``.
    """

    by_source: Mapping[str, int] = field(default_factory=dict)
    default: int = 0
    consult: bool = False
    cuts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    default_cuts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_source", MappingProxyType(dict(self.by_source)))
        object.__setattr__(self, "cuts", MappingProxyType(dict(self.cuts)))

    @classmethod
    def uniform(cls, k: int) -> "DraftBudget":
        """Every source may draft ``k`` tokens."""
        return cls({}, k)

    def for_source(self, source: str) -> int:
        return self.by_source.get(source, self.default)

    @property
    def most(self) -> int:
        """The largest budget of any source."""
        return max([self.default, *self.by_source.values()])

    @property
    def asks_drafter(self) -> bool:
        """Whether the engine should call the drafter this step."""
        return self.consult or self.most > 0

    def capped(self, limit: int) -> "DraftBudget":
        """The same budget with no source above ``limit`` (the room left in the reply)."""
        limit = max(limit, 0)
        return DraftBudget({s: min(k, limit) for s, k in self.by_source.items()},
                           min(self.default, limit), self.consult, self.cuts,
                           self.default_cuts)

    def cut(self, source: str, m: int) -> int:
        """How many of the ``m`` tokens ``source`` proposed to verify: ``cuts[source][m]``
        where the policy gave one (``default_cuts[m]`` for a source it has no decision for),
        else all ``m``."""
        table = self.cuts.get(source, () if source in self.by_source else self.default_cuts)
        return table[m] if m < len(table) else m


@dataclass(frozen=True)
class ShadowScore:
    """A proposal of ``proposed`` tokens from ``source`` would have had ``matched`` accepted
    (positions ``start`` on: those before were in an earlier score of the same proposal); with
    ``settled`` False, the first ``matched`` matched the tokens emitted so far, the rest is not
    decided yet (a partial score: what is known is told as soon as it is known).

    A free drafter replays its proposals over the emitted tokens: the target emitted x with
    probability p(x), the acceptance probability of a one-hot proposal of x, so a match is an
    unbiased draw of that proposal's acceptance.
    """

    source: str
    proposed: int
    matched: int
    start: int = 0  # the positions before it were scored already (an earlier, partial score)
    settled: bool = True  # False: the first ``matched`` matched so far; the rest is undecided


@dataclass(frozen=True)
class Proposal:
    """Drafted ``tokens`` and the distributions they were drawn from (``probs``).

    ``rows`` (len(tokens), V): row i is the distribution tokens[i] was drawn from; None for a
    deterministic proposal (one-hot rows over ``vocab_size`` tokens, built only if ``probs`` is
    read: greedy verification never does). ``source``: which source made the tokens ("" when
    there are none).
    """

    tokens: list[int]
    rows: np.ndarray | None
    source: str = ""
    vocab_size: int = 0

    @classmethod
    def empty(cls, vocab_size: int) -> "Proposal":
        return cls.one_hot([], vocab_size, "")

    @classmethod
    def one_hot(cls, tokens: list[int], vocab_size: int, source: str) -> "Proposal":
        """A deterministic proposal (an n-gram lookup, speculative edits)."""
        return cls(tokens, None, source, vocab_size)

    def cut(self, n: int) -> "Proposal":
        """The first ``n`` tokens of this proposal (with their rows); an empty proposal, a plain
        step, for n = 0."""
        if n >= len(self.tokens):
            return self
        rows = None if self.rows is None else self.rows[:n]
        return Proposal(self.tokens[:n], rows, self.source if n else "",
                        self.vocab_size or (self.rows.shape[1] if self.rows is not None else 0))

    @cached_property
    def probs(self) -> np.ndarray:
        """(len(tokens), V): row i is the distribution tokens[i] was drawn from."""
        return one_hot_rows(self.tokens, self.vocab_size) if self.rows is None else self.rows


def one_hot_rows(tokens: Sequence[int], vocab_size: int) -> np.ndarray:
    """(len(tokens), vocab_size) float64, row i one-hot on tokens[i]: the distributions of a
    deterministic proposal (n-gram lookup, speculative edits)."""
    rows = np.zeros((len(tokens), vocab_size), dtype=np.float64)
    if len(tokens):
        rows[np.arange(len(tokens)), np.asarray(tokens, dtype=np.intp)] = 1.0
    return rows


@dataclass(frozen=True)
class DraftHints:
    """What one reply tells the drafters, beyond its context.

    ``predicted``: the tokens the reply is expected to be (an API client's predicted output;
    empty: none), a source verified like every other. ``document``: the key of the history-wide
    suffix index's document that the reply's context is (a saved chat's id, or a key of the
    caller's own; None: a conversation not kept, the index's ``LIVE`` document), so the index
    draws on every other document and files the reply's text under this one. ``renamed``: the
    documents the caller saved under another key since its last reply (old key -> new key);
    ``forgotten``: documents deleted since then, which the index may no longer draw from. A
    drafter without the source a hint is for ignores it.
    """

    predicted: tuple[int, ...] = ()
    document: Hashable | None = None
    renamed: Mapping[Hashable, Hashable] = field(default_factory=dict)
    forgotten: frozenset[Hashable] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicted", tuple(self.predicted))
        object.__setattr__(self, "renamed", MappingProxyType(dict(self.renamed)))
        object.__setattr__(self, "forgotten", frozenset(self.forgotten))


NO_HINTS = DraftHints()


class Drafter(Protocol):
    """Proposes tokens that follow ``context``, within a ``DraftBudget``."""

    @property
    def name(self) -> str: ...

    def prefill(self, context: Sequence[int], hints: DraftHints) -> None:
        """A reply starts: bring any cache up to ``context`` ahead of the first proposal (may do
        nothing), and take the reply's ``hints``, which hold until the next ``prefill``.

        ``context`` is the prompt less its last token (what the target's cache holds: the engine
        feeds that token with the first step), so the reply's first token is at position
        ``len(context) + 1`` of the contexts that ``propose`` is given."""
        ...

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """At most ``budget.for_source(s)`` tokens from the one source ``s`` that proposes."""
        ...

    def score_emitted(self, context: Sequence[int]) -> tuple[ShadowScore, ...]:
        """Take the tokens a step emitted (``context``, the reply so far, extends the contexts
        given before) and return what they decided of the would-be proposals this drafter
        scores for free (``ShadowScore``s, each told once; () for a drafter that does not score
        itself). The engine calls it after every step, so the step's ``StepOutcome`` tells the
        policy how the step's own proposal fared before it chooses the next budget."""
        ...

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Forget any cached state past the longest prefix shared with ``context``.

        The first ``verified`` tokens of ``context`` are known to match what is cached.
        """
        ...

    def close(self) -> None:
        """Free the models this drafter holds (nothing for a model-free drafter)."""
        ...


MAX_DRAFT_LENGTH = 16


@dataclass(frozen=True)
class StepOutcome:
    """One verified step: ``source`` proposed ``drafted`` tokens ("" and 0 for a plain step), the
    target accepted ``accepted`` of them; ``scores`` are a free drafter's would-be outcomes."""

    source: str
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    scores: tuple[ShadowScore, ...] = ()


class DraftPolicy(Protocol):
    """Chooses each step's ``DraftBudget`` and learns from its ``StepOutcome``. Read from other
    threads too (a front end shows the K in force while the engine drafts): thread-safe."""

    @property
    def adaptive(self) -> bool:
        """Whether the policy chooses K itself (an auto policy) rather than keeping the user's."""
        ...

    def current_k(self) -> int:
        """The draft length in force: the fixed K, or an adaptive policy's choice of the moment
        (the longest any source drafts; probes aside)."""
        ...

    def budget(self) -> DraftBudget: ...

    def observe(self, outcome: StepOutcome) -> None: ...

    def start_turn(self) -> None:
        """A new reply begins (another prompt: perhaps another kind of text)."""
        ...


def checked_draft_length(k: int) -> int:
    """``k`` if it is a valid draft length, else ``ValueError``."""
    if not 0 <= k <= MAX_DRAFT_LENGTH:
        raise ValueError(f"draft length must be between 0 and {MAX_DRAFT_LENGTH}, got {k}")
    return k
