"""What a step costs on this machine, measured before the first reply: the target's verification
of n tokens for every n a draft can need, and the draft model's cost per token.

An adaptive policy that does not know these costs has to find them by drafting, and on a CPU each
wrong guess costs: verifying 8 tokens may cost 6 decode steps, 16 tokens fewer than 15, so a
policy that interpolates or extrapolates a smooth curve drafts where it loses and misses the
cheap batch sizes. ``measure`` times the whole curve once, the way the engine evaluates (after a
chat prompt, n tokens with logits for every position, the cache truncated back after each
timing); the caller keeps the result per machine, pair and layout, and the policy refines it
online.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatapp.backends.base import Backend
from chatapp.engine.kv import evaluate_sequence

REPEATS = 2  # timings per size; the fastest is kept (a busy moment only ever makes one slower)
DRAFT_TIMINGS = 4  # one-token evaluations of the draft model


@dataclass(frozen=True)
class VerifyCost:
    """Verifying ``tokens`` tokens took ``seconds``."""

    tokens: int
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """Seconds to verify n tokens (``verify[n]``, n = 1..len) and, with a draft model, seconds
    per draft-model token (``draft_token``)."""

    verify: Mapping[int, float]
    draft_token: float | None = None

    def as_data(self) -> dict[str, Any]:
        """Plain JSON data; ``from_data`` reads it back."""
        return {"verify": {str(n): s for n, s in sorted(self.verify.items())},
                "draft_token": self.draft_token}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> "Calibration":
        """The calibration ``as_data`` wrote; ``ValueError`` for anything else (a size below 1,
        a cost that is not a finite positive number)."""
        verify = {int(n): _seconds(s) for n, s in dict(data["verify"]).items()}
        if not verify or min(verify) < 1:
            raise ValueError("no verification costs, or a size below 1")
        draft = data.get("draft_token")
        return cls(verify, None if draft is None else _seconds(draft))


def _seconds(value: Any) -> float:
    seconds = float(value)
    if not 0.0 < seconds < 3600.0:
        raise ValueError(f"not a cost in seconds: {value!r}")
    return seconds


def repeated_feed(context: Sequence[int], n: int) -> list[int]:
    """``n`` tokens to time after ``context``: the context's own tokens, repeated as needed."""
    return (list(context) * (1 + n // max(len(context), 1)))[:n]


def measure_verify_costs(target: Backend, context: Sequence[int], feed: Sequence[int],
                         sizes: Sequence[int], repeats: int = REPEATS,
                         summary: Callable[[list[float]], float] = min) -> list[VerifyCost]:
    """Per n in ``sizes``: ``summary`` (default the fastest) of ``repeats`` timings of evaluating
    ``feed[:n]`` after ``context`` with logits for all n positions; the target's cache holds
    ``context`` after. ``feed`` must hold at least ``max(sizes)`` tokens."""
    if len(feed) < max(sizes):
        raise ValueError(f"{len(feed)} tokens to feed, {max(sizes)} needed")
    evaluate_sequence(target, context, 1)
    costs = []
    for n in sizes:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            target.evaluate(feed[:n], n)
            times.append(time.perf_counter() - started)
            target.truncate(len(context))
        costs.append(VerifyCost(n, summary(times)))
    return costs


def measure(target: Backend, context: Sequence[int], largest: int,
            draft: Backend | None = None) -> Calibration:
    """The costs of verifying n = 1..``largest`` tokens after ``context`` on ``target`` and, with
    a ``draft`` backend, of one draft-model token after the same context. Both caches are left
    holding ``context`` (or less)."""
    feed = repeated_feed(context, largest)
    costs = measure_verify_costs(target, context, feed, range(1, largest + 1))
    draft_token = None
    if draft is not None:  # one token after the context: a draft step
        draft_token = measure_verify_costs(draft, context, feed, [1], DRAFT_TIMINGS)[0].seconds
    return Calibration({c.tokens: c.seconds for c in costs}, draft_token)
