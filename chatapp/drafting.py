"""Draft proposals, the budget a policy gives a drafter, and keeping a backend's KV cache in step
with a token sequence.

A ``Proposal`` keeps what was proposed together with the distributions it was drawn from, so the
verifier always divides by the q that actually produced each token (a greedy or n-gram drafter
proposes with a one-hot q). It also says which source made it, so the engine can tell the policy,
and carries the would-be outcomes of proposals a free drafter scored on the emitted tokens.

One step, as the engine drives it: the policy gives a ``DraftBudget`` (how many tokens each source
may draft), the drafter proposes within it, the target verifies, and the engine reports the
outcome to the policy (``chatapp.draft_policy.StepOutcome``). Drafters never call the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Protocol

import numpy as np

from chatapp.backends.base import Backend
from chatapp.sampling import SamplingParams, greedy_tokens, probabilities, sample

MODEL_SOURCE = "model"  # the draft model's proposals
LONGEST_FREE_DRAFT = 16  # the longest draft of a source that costs nothing to ask (a lookup, the
# edits, the suffix index), and how far ahead such a source scores itself. On the 2-core CPU of
# the README verifying 16 tokens costs about 7.5 decode steps, less than 15 or 17 (llama.cpp's
# batched kernels work in blocks). 32 (13 steps there) was measured no better on the code-edit
# prompts and cost 4-6% in the policy simulation (tests/test_auto_simulation.py).


@dataclass(frozen=True)
class DraftBudget:
    """How many tokens each source may draft in one step: the policy's decision, as data.

    ``by_source`` names the sources the policy has a decision for; any other source gets
    ``default``. ``consult``: ask the drafter even when every budget is 0, because it scores its
    would-be proposals for free (an n-gram lookup) and the policy learns from that.
    """

    by_source: Mapping[str, int] = field(default_factory=dict)
    default: int = 0
    consult: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_source", MappingProxyType(dict(self.by_source)))

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
                           min(self.default, limit), self.consult)


@dataclass(frozen=True)
class ShadowScore:
    """A proposal of ``proposed`` tokens from ``source`` would have had ``matched`` accepted.

    A free drafter replays its proposals over the emitted tokens: the target emitted x with
    probability p(x), the acceptance probability of a one-hot proposal of x, so a match is an
    unbiased draw of that proposal's acceptance.
    """

    source: str
    proposed: int
    matched: int


@dataclass(frozen=True)
class Proposal:
    """Drafted ``tokens`` and the distributions they were drawn from (``probs``).

    ``rows`` (len(tokens), V): row i is the distribution tokens[i] was drawn from; None for a
    deterministic proposal (one-hot rows over ``vocab_size`` tokens, built only if ``probs`` is
    read: greedy verification never does). ``source``: which source made the tokens ("" when
    there are none); ``scores``: would-be outcomes a free drafter scored since its last call.
    """

    tokens: list[int]
    rows: np.ndarray | None
    source: str = ""
    scores: tuple[ShadowScore, ...] = ()
    vocab_size: int = 0

    @classmethod
    def empty(cls, vocab_size: int, scores: tuple[ShadowScore, ...] = ()) -> "Proposal":
        return cls.one_hot([], vocab_size, "", scores)

    @classmethod
    def one_hot(cls, tokens: list[int], vocab_size: int, source: str,
                scores: tuple[ShadowScore, ...] = ()) -> "Proposal":
        """A deterministic proposal (an n-gram lookup, speculative edits)."""
        return cls(tokens, None, source, scores, vocab_size)

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


class Drafter(Protocol):
    """Proposes tokens that follow ``context``, within a ``DraftBudget``."""

    @property
    def name(self) -> str: ...

    def prefill(self, context: Sequence[int]) -> None:
        """Bring any cache up to ``context`` ahead of the first proposal (may do nothing)."""
        ...

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """At most ``budget.for_source(s)`` tokens from the one source ``s`` that proposes."""
        ...

    def rollback(self, context: Sequence[int], verified: int) -> None:
        """Forget any cached state past the longest prefix shared with ``context``.

        The first ``verified`` tokens of ``context`` are known to match what is cached.
        """
        ...

    def close(self) -> None:
        """Free the models this drafter holds (nothing for a model-free drafter)."""
        ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (the whole-prefix case at C speed)."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def rollback_to_prefix(backend: Backend, sequence: Sequence[int], verified: int = 0) -> None:
    """Truncate ``backend``'s cache to its longest prefix shared with ``sequence``.

    Positions below ``verified`` are trusted to match and are not compared.
    """
    cached = backend.cached_tokens
    start = min(verified, len(cached), len(sequence))
    keep = start + common_prefix_length(cached[start:], sequence[start:])
    if keep < len(cached):
        backend.truncate(keep)


def evaluate_sequence(backend: Backend, sequence: Sequence[int], n_logits: int) -> np.ndarray:
    """Make ``backend``'s cache hold ``sequence`` and return logits after its last ``n_logits``.

    Reuses the longest cached prefix; rolls back whatever diverges (rejected drafts, an edited
    conversation). At least ``n_logits`` tokens are re-fed so their logits can be produced.
    """
    cached = backend.cached_tokens
    keep = min(common_prefix_length(cached, sequence), len(sequence) - n_logits)
    if keep < len(cached):
        backend.truncate(keep)
    fresh = list(sequence[keep:])
    if not fresh:
        return np.zeros((0, backend.vocab_size), dtype=np.float32)
    return backend.evaluate(fresh, n_logits)


class ModelDrafter:
    """Drafts autoregressively with a small model, sampling with the same params as the target.

    Its source is ``MODEL_SOURCE``. With ``deferred``, ``prefill`` evaluates nothing: the draft
    model catches up on the first proposal (``evaluate_sequence`` feeds what it lacks in one
    batch), so when the policy never drafts, the draft model never evaluates the prompt. Its
    cache still never holds tokens that are not in the conversation: ``prefill`` drops whatever
    the new context no longer shares (a new chat, an edited message).
    """

    def __init__(self, backend: Backend, deferred: bool = False) -> None:
        self.backend = backend
        self.deferred = deferred

    @property
    def name(self) -> str:
        return self.backend.name

    def prefill(self, context: Sequence[int]) -> None:
        if self.deferred:
            rollback_to_prefix(self.backend, context)
        else:
            evaluate_sequence(self.backend, context, 0)

    def rollback(self, context: Sequence[int], verified: int) -> None:
        rollback_to_prefix(self.backend, context, verified)

    def close(self) -> None:
        self.backend.close()

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        return self.draft(context, budget.for_source(MODEL_SOURCE), params, rng)

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> Proposal:
        """Up to ``k`` tokens sampled from the draft model (fewer when it proposes a stop)."""
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        sequence = list(context)
        for _ in range(k):
            logits = evaluate_sequence(self.backend, sequence, 1)
            if params.greedy:  # a one-hot row, left unbuilt: greedy verification never reads it
                token = greedy_tokens(logits)[0]
            else:
                rows.append(probabilities(logits[0], params))
                token = sample(rows[-1], rng)
            tokens.append(token)
            sequence.append(token)
            if token in self.backend.stop_ids:
                break
        if params.greedy or not tokens:
            return Proposal.one_hot(tokens, self.backend.vocab_size, MODEL_SOURCE)
        return Proposal(tokens, np.stack(rows), MODEL_SOURCE)
