"""What verifying n tokens costs on this machine, learnt from the target's timings."""

from __future__ import annotations

import math
from typing import Any

from chatapp.learnt_data import RESUME_WEIGHT, non_negative_floats


class VerifyCostModel:
    """Seconds to verify n tokens, n = 1..max_n, learnt from timings.

    Per n, a mean with exponential forgetting (a timing above ``outlier`` x the current mean is
    clipped once the mean is established: a busy machine must not swing it). ``predict`` shrinks
    each mean towards the curve ``a + b ln(n)`` fitted to all of them, with a ridge pulling b
    towards ``slope_prior`` x the one-token cost, so that one observed n already extrapolates; the
    result is made non-decreasing in n. Why ln(n): a batch costs less per token as it grows (on the
    2-core CPU of MODELS.md, 46 / 121 / 144 ms for 1 / 4 / 6 tokens is 46 + 55 ln(n) within 5%),
    and a GPU is flat (b near 0); erring on the cheap side for an n never tried makes the policy
    try it and learn, erring on the dear side would never be corrected.
    """

    def __init__(self, max_n: int, forget: float = 0.95, slope_prior: float = 0.8,
                 shrink_weight: float = 2.0, ridge: float = 2.0, outlier: float = 2.0) -> None:
        self.max_n = max_n
        self.forget = forget
        self.slope_prior = slope_prior
        self.shrink_weight = shrink_weight
        self.ridge = ridge
        self.outlier = outlier
        self._mean = [0.0] * (max_n + 1)
        self._weight = [0.0] * (max_n + 1)
        self._fitted: list[float] | None = None

    def learnt(self) -> dict[str, list[float]]:
        return {"mean": list(self._mean), "weight": list(self._weight)}

    def resume(self, data: dict[str, Any]) -> None:
        """Take ``learnt()`` data of an earlier run, each weight capped at ``RESUME_WEIGHT``."""
        mean, weight = non_negative_floats(data["mean"]), non_negative_floats(data["weight"])
        if len(mean) != self.max_n + 1 or len(weight) != self.max_n + 1:
            raise ValueError("verification costs for another max_k")
        self._mean = mean
        self._weight = [min(w, RESUME_WEIGHT) for w in weight]
        self._fitted = None

    def observe(self, n: int, seconds: float) -> None:
        if not 1 <= n <= self.max_n or not seconds >= 0.0:
            return
        mean, weight = self._mean[n], self._weight[n]
        if weight >= 3.0:
            seconds = min(seconds, self.outlier * mean)
        weight = self.forget * weight + 1.0
        self._mean[n] = mean + (seconds - mean) / weight
        self._weight[n] = weight
        self._fitted = None

    def predict(self, n: int) -> float | None:
        if self._fitted is None:
            self._fitted = self._fit()
        if not self._fitted:
            return None
        return self._fitted[min(max(n, 1), self.max_n) - 1]

    def _fit(self) -> list[float]:
        points = [(math.log(n), self._mean[n], self._weight[n]) for n in range(1, self.max_n + 1)
                  if self._weight[n] > 0.0]
        if not points:
            return []
        s = self.slope_prior
        total = sum(w for _, _, w in points)
        one = sum(w * v / (1.0 + s * x) for x, v, w in points) / total
        prior_b = s * one
        sx = sum(w * x for x, _, w in points)
        sv = sum(w * v for _, v, w in points)
        sxx = sum(w * x * x for x, _, w in points)
        sxv = sum(w * x * v for x, v, w in points)
        # minimise sum w (a + b x - v)^2 + ridge (b - prior_b)^2 (ridge in units of one-token
        # cost, so it is scale-free); a follows from b.
        ridge = self.ridge
        b = (sxv - sx * sv / total + ridge * prior_b) / (sxx - sx * sx / total + ridge)
        b = max(b, 0.0)
        a = (sv - b * sx) / total
        out, floor = [], 0.0
        for n in range(1, self.max_n + 1):
            curve = max(a + b * math.log(n), 1e-9)
            w = self._weight[n]
            floor = max(floor, (w * self._mean[n] + self.shrink_weight * curve)
                        / (w + self.shrink_weight))
            out.append(floor)
        return out
