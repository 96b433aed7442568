"""The bench's rounds: ratios paired within a round, and their median and spread over rounds.

With ``--repeats N`` every prompt runs N rounds, each round every configuration once. A ratio is
taken within a round (a configuration's speed over the target-only speed of the same round and
prompt), never between rounds: machine noise that lasts a round (a neighbour's job, a warm CPU)
hits both runs of the pair alike and cancels. A category's ratio in a round is the geometric mean
of its prompts' ratios in that round; the bench reports the median of those over the rounds, with
their lowest and highest as the spread. The median of paired ratios rather than the mean (one
disturbed run moves a mean, not a median) and rather than the ratio of the two medians (which
unpairs the runs and lets noise that hit one round count twice).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A ratio over rounds: its median, lowest and highest."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        """The median and range of ``values`` (all zero when there is none)."""
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(statistics.median(values), min(values), max(values))

    def cell(self, spread: bool) -> str:
        """"1.02", or with ``spread`` "1.02 (0.97-1.05)"."""
        text = f"{self.median:.2f}"
        return f"{text} ({self.low:.2f}-{self.high:.2f})" if spread else text


def paired_ratios(speeds: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Round by round, ``speeds[r] / reference[r]`` (0 where the reference made no progress)."""
    if len(speeds) != len(reference):
        raise ValueError(f"{len(speeds)} rounds against {len(reference)} reference rounds")
    return [s / r if r > 0 else 0.0 for s, r in zip(speeds, reference)]


def median_round(ratios: Sequence[float]) -> int:
    """The round whose ratio is closest to the median of ``ratios`` (the first on a tie): the
    run that stands for the configuration on the prompt."""
    middle = statistics.median(ratios)
    return min(range(len(ratios)), key=lambda r: abs(ratios[r] - middle))


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of the positive ``values`` (0 when there is none)."""
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def per_round_geomeans(ratios_by_prompt: Sequence[Sequence[float]]) -> list[float]:
    """For each round, the geometric mean over prompts of their ratios in that round; every
    prompt has the same rounds."""
    rounds = {len(ratios) for ratios in ratios_by_prompt}
    if len(rounds) > 1:
        raise ValueError(f"prompts with different numbers of rounds: {sorted(rounds)}")
    count = rounds.pop() if rounds else 0
    return [geometric_mean([ratios[r] for ratios in ratios_by_prompt]) for r in range(count)]
