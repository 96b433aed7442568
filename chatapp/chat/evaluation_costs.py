"""What evaluating n tokens costs a loaded model here: the stopwatch shared by `specchat bench
--verify-costs` (the whole curve the auto policy learns) and the layout measurement at first use
(``chatapp.chat.layout_costs``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.backends.base import Backend
from chatapp.engine.kv import evaluate_sequence

REPEATS = 5


@dataclass(frozen=True)
class VerifyCost:
    """Verifying ``tokens`` tokens took ``seconds`` (median)."""

    tokens: int
    seconds: float


def measure_verify_costs(target: Backend, context: Sequence[int], feed: Sequence[int],
                         sizes: Sequence[int], repeats: int = REPEATS) -> list[VerifyCost]:
    """Per n in ``sizes``: the median seconds of evaluating ``feed[:n]`` after ``context`` with
    logits for all n positions, as the engine verifies. ``feed`` must hold at least
    ``max(sizes)`` tokens."""
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
        costs.append(VerifyCost(n, statistics.median(times)))
    return costs
