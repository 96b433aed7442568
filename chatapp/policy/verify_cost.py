"""What verifying n tokens costs on this machine, learnt per n from the target's timings."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from chatapp.policy.learnt_data import RESUME_WEIGHT, non_negative_floats

ESTABLISHED = 3.0  # observations after which an n's own mean is the yardstick for outliers
AGE = 0.995  # per timing of another n, an n's weight ages (first calls are slow: see STALE)
WORTH_A_TRY = 0.95  # an exploring guess below this x the interpolation is offered; closer to
# it, the try would teach little (a GPU's flat costs) and only perturb the choice
STALE = 0.25  # an n whose weight aged below this is extrapolated again, and so tried again: a
# cost measured dear once (the first exploring steps, a busy moment) is not believed for good
LOAD_RANGE = 0.25, 4.0  # how far the machine's load may scale a calibrated curve, either way
CALIBRATION_WEIGHT = 2.0  # timings a calibrated cost counts as beside an n's own (it is the
# fastest of two timings: one slow first timing must not replace it, or a cheap batch size is
# believed dear and never tried again)


class VerifyCostModel:
    """Seconds to verify n tokens, n = 1..max_n, learnt per n as measured.

    Per n, a mean with exponential forgetting. No functional form is imposed on measured n: the
    cost need not grow with n (on the 2-core Xeon of issue 12 a 4-token batch costs 86 ms, a
    3-token one 101; on the 2-core EPYC of docs/benchmarks.md 16 tokens cost 238 ms, 15 cost 297
    and 8 cost 208: llama.cpp's batched kernels work in blocks), so a measured n is predicted by
    its own mean. An n not measured is predicted on the cheap side, so that the policy tries it and
    learns, where erring on the dear side would never be corrected:

    - between two measured n, linearly interpolated (below the true cost where the cost is
      concave or linear in n, as on a GPU or a CPU); with ``predict(n, explore=True)``, an n
      never measured is guessed at the cost of the measured n just below it (once the measured n
      above it is established, where that is under ``WORTH_A_TRY`` x the interpolation): a
      batch size that is cheaper than its neighbours, as 16 above, is found only if it is tried;
    - above the measured range, by the curve ``a + b ln(n)`` fitted to the measured means (a
      batch costs less per token as it grows: below a linear or convex cost), with a ridge
      pulling b towards ``slope_prior`` x the one-token cost so that one measured n already
      extrapolates.

    One slow step (a busy machine) does not swing a mean: a timing above ``outlier`` x the
    prediction is clipped, once the n has ``ESTABLISHED`` observations, or for an n not yet
    established, once other n are. An n not timed for long (its weight aged by ``AGE`` per
    timing of another n, below ``STALE``) counts as never measured, so that a cost that was
    measured dear is tried again now and then rather than believed for good.

    A ``calibrate``d model knows the whole curve before its first timing (measured once for the
    machine, pair and layout: ``chatapp.engine.calibration``): an n without recent timings is
    then predicted by its calibrated cost, scaled by how the recent timings compare with the
    calibration (the machine's load of the moment, ``LOAD_RANGE`` at most), and nothing is
    guessed or extrapolated; an n with recent timings by their mean and that scaled cost, the
    latter counting as ``CALIBRATION_WEIGHT`` timings.
    """

    def __init__(self, max_n: int, forget: float = 0.95, slope_prior: float = 0.8,
                 ridge: float = 0.5, outlier: float = 1.5) -> None:
        self.max_n = max_n
        self.forget = forget
        self.slope_prior = slope_prior
        self.ridge = ridge
        self.outlier = outlier
        self._mean = [0.0] * (max_n + 1)
        self._weight = [0.0] * (max_n + 1)
        self._predicted: list[float] | None = None  # predict(n), n = 1..max_n; None: stale
        self._explored: list[float] = []  # predict(n, explore=True)
        self._calibrated: list[float | None] = [None] * (max_n + 1)  # index 0 unused

    def calibrate(self, costs: Mapping[int, float]) -> None:
        """Take the measured seconds to verify n tokens (``costs[n]``; sizes outside 1..max_n
        are ignored) as the curve to predict from where there are no recent timings."""
        self._calibrated = [None] + [costs.get(n) for n in range(1, self.max_n + 1)]
        self._predicted = None

    @property
    def calibrated(self) -> bool:
        """Whether a calibration covers every n (``calibrate``)."""
        return all(cost is not None for cost in self._calibrated[1:])

    def take_calibration(self, other: "VerifyCostModel") -> None:
        """The calibration of ``other`` (a model this one replaces)."""
        self._calibrated = list(other._calibrated)[:self.max_n + 1]
        self._calibrated += [None] * (self.max_n + 1 - len(self._calibrated))
        self._predicted = None

    def load(self) -> float:
        """How the recent timings compare with the calibration (``_load``; 1.0 without a
        calibration): what scales any other evaluation calibrated with them, such as a draft
        model's token (a busy moment makes it dearer too, and must not make drafting look
        cheaper)."""
        return self._load() if self.calibrated else 1.0

    def learnt(self) -> dict[str, list[float]]:
        """The per-n means and their weights (index 0 unused), plain JSON data."""
        return {"mean": list(self._mean), "weight": list(self._weight)}

    def resume(self, data: dict[str, Any]) -> None:
        """Take ``learnt()`` data of an earlier run, each weight capped at ``RESUME_WEIGHT``;
        ``ValueError`` for data of another shape or with negative or non-finite values."""
        mean, weight = non_negative_floats(data["mean"]), non_negative_floats(data["weight"])
        if len(mean) != self.max_n + 1 or len(weight) != self.max_n + 1:
            raise ValueError("verification costs for another max_k")
        self._mean = mean
        self._weight = [min(w, RESUME_WEIGHT) for w in weight]
        self._predicted = None

    def observe(self, n: int, seconds: float) -> None:
        """One timing of verifying ``n`` tokens (ignored outside 1..max_n or not >= 0)."""
        if not 1 <= n <= self.max_n or not seconds >= 0.0:
            return
        mean, weight = self._mean[n], self._weight[n]
        others = sum(self._weight) - weight
        if weight >= ESTABLISHED or others >= ESTABLISHED:
            seconds = min(seconds, self.outlier * self._reference(n))
        weight = self.forget * weight + 1.0
        self._mean[n] = mean + (seconds - mean) / weight
        self._weight = [w * AGE for w in self._weight]
        self._weight[n] = weight
        self._predicted = None

    def predict(self, n: int, explore: bool = False) -> float | None:
        """Seconds to verify ``n`` tokens (clamped to 1..max_n); None before any timing. With
        ``explore``, an n never measured between measured ones is guessed at the cost of the
        one below it rather than interpolated (see the class docstring)."""
        curve = self.curve(explore)
        return curve[min(max(n, 1), self.max_n) - 1] if curve else None

    def curve(self, explore: bool = False) -> list[float]:
        """``predict(n, explore)`` for n = 1..max_n (empty before any timing or calibration);
        the list is shared: read it, never change it."""
        if self._predicted is None:
            self._predicted, self._explored = self._predictions()
        return self._explored if explore else self._predicted

    def measured(self, n: int) -> bool:
        """Whether ``n`` tokens were timed, recently enough (else ``predict`` extrapolates)."""
        return 1 <= n <= self.max_n and self._weight[n] >= STALE

    def ever_measured(self, n: int) -> bool:
        """Whether ``n`` tokens were ever timed (or resumed as timed)."""
        return 1 <= n <= self.max_n and self._weight[n] > 0.0

    def _measured_ns(self) -> list[int]:
        """The n timed recently enough (``measured``), ascending."""
        return [n for n in range(1, self.max_n + 1) if self.measured(n)]

    def _reference(self, n: int) -> float:
        """What a timing of ``n`` is judged against: its established mean; else, between two
        measured n, the interpolated prediction; outside them, a bound that is never cheap: below
        the smallest measured n its cost, above the largest its cost plus, per token more, the
        smallest's cost per token. (The cheap extrapolation there is meant to get an n tried;
        clipping its first timings to it would keep a dear n, or one token, looking cheap.)"""
        if self._weight[n] >= ESTABLISHED:
            return self._mean[n]
        if self.calibrated:
            return self._calibrated_cost(n)
        measured = self._measured_ns()
        if not measured:
            return self._mean[n]
        smallest, largest = measured[0], measured[-1]
        if n < smallest:
            return self._mean[smallest]
        if n > largest:
            return self._mean[largest] + (n - largest) * self._mean[smallest] / smallest
        return self.predict(n) or self._mean[n]

    def _predictions(self) -> tuple[list[float], list[float]]:
        """predict(n) and predict(n, explore=True) for n = 1..max_n: the mean where measured,
        else the cheap guess."""
        if self.calibrated:
            load = self._load()
            out = [self._calibrated_estimate(n, load) for n in range(1, self.max_n + 1)]
            return out, out
        measured = self._measured_ns()
        if not measured:
            return [], []
        a, b = self._curve(measured)
        out, explored = [], []
        for n in range(1, self.max_n + 1):
            at = bisect_left(measured, n)  # measured[at] is the first measured n' >= n
            if at < len(measured) and (measured[at] == n or at > 0):
                below = n if measured[at] == n else measured[at - 1]
                out.append(self._interpolated(n, below, measured[at]))
                explored.append(self._guess(n, below, measured[at], out[-1]))
            else:
                out.append(max(a + b * math.log(n), 1e-9))
                explored.append(out[-1])
        return out, explored

    def _calibrated_estimate(self, n: int, load: float) -> float:
        """predict(n) of a calibrated model: the calibrated cost scaled by ``load``, averaged
        with the recent timings of ``n`` if any (the calibration weighing ``CALIBRATION_WEIGHT``
        timings)."""
        calibrated = (self._calibrated[n] or 0.0) * load
        if not self.measured(n):
            return calibrated
        weight = self._weight[n]
        return (weight * self._mean[n] + CALIBRATION_WEIGHT * calibrated) / (
            weight + CALIBRATION_WEIGHT)

    def _calibrated_cost(self, n: int) -> float:
        """The calibrated cost of ``n`` tokens, scaled by the load of the moment (``_load``)."""
        return (self._calibrated[n] or 0.0) * self._load()

    def _load(self) -> float:
        """How the recent timings compare with the calibration: their weighted mean over what
        the calibration says of the same sizes, within ``LOAD_RANGE``."""
        timed = calibrated = 0.0
        for m in self._measured_ns():
            timed += self._weight[m] * self._mean[m]
            calibrated += self._weight[m] * (self._calibrated[m] or 0.0)
        load = timed / calibrated if calibrated > 0.0 else 1.0
        return min(max(load, LOAD_RANGE[0]), LOAD_RANGE[1])

    def _guess(self, n: int, below: int, above: int, interpolated: float) -> float:
        """predict(n, explore=True) for ``below`` <= n <= ``above``, both measured: the cost of
        ``below`` for an n never measured, once ``above`` is established and where that is
        under ``WORTH_A_TRY`` x the interpolation; else the interpolation."""
        if self.ever_measured(n) or self._weight[above] < ESTABLISHED:
            return interpolated
        guess = self._mean[below]
        return guess if guess < WORTH_A_TRY * interpolated else interpolated

    def _interpolated(self, n: int, below: int, above: int) -> float:
        """The mean at n, linear between the measured ``below`` <= n <= ``above``."""
        if below == above:
            return self._mean[n]
        t = (n - below) / (above - below)
        return (1.0 - t) * self._mean[below] + t * self._mean[above]

    def _curve(self, measured: list[int]) -> tuple[float, float]:
        """a, b of ``a + b ln(n)`` fitted to the measured means by weighted least squares, plus
        ``ridge`` (b - slope_prior x one-token cost)^2; b >= 0."""
        points = [(math.log(n), self._mean[n], self._weight[n]) for n in measured]
        s = self.slope_prior
        total = sum(w for _, _, w in points)
        one = sum(w * v / (1.0 + s * x) for x, v, w in points) / total
        sx = sum(w * x for x, _, w in points)
        sv = sum(w * v for _, v, w in points)
        sxx = sum(w * x * x for x, _, w in points)
        sxv = sum(w * x * v for x, v, w in points)
        b = (sxv - sx * sv / total + self.ridge * s * one) / (sxx - sx * sx / total + self.ridge)
        b = max(b, 0.0)
        return (sv - b * sx) / total, b
