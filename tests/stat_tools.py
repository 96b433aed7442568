"""Goodness-of-fit helpers for the statistical tests (no scipy needed)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np


def chi2_critical(df: int, alpha: float) -> float:
    """Upper ``alpha`` quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    z = NormalDist().inv_cdf(1.0 - alpha)
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * np.sqrt(h)) ** 3


def chi_square(counts: np.ndarray, expected_probs: np.ndarray, min_expected: float = 5.0
               ) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom, pooling cells expected below ``min_expected``.

    Counts observed in cells of zero expected probability make the statistic infinite.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    expected = np.asarray(expected_probs, dtype=np.float64) * n
    if np.any(counts[expected == 0] > 0):
        return float("inf"), 1
    small = expected < min_expected
    obs = list(counts[~small])
    exp = list(expected[~small])
    if small.any() and expected[small].sum() > 0:
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    return float(((obs_a - exp_a) ** 2 / exp_a).sum()), max(len(obs_a) - 1, 1)


def fits(counts: np.ndarray, expected_probs: np.ndarray, alpha: float = 1e-4) -> bool:
    """True when the counts are consistent with ``expected_probs`` at significance ``alpha``."""
    stat, df = chi_square(counts, expected_probs)
    return stat <= chi2_critical(df, alpha)
