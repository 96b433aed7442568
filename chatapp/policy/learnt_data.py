"""Validating what a policy learnt in an earlier run before it is trusted again."""

from __future__ import annotations

import math
from typing import Any

RESUME_WEIGHT = 4.0  # what an earlier run measured counts as at most this many observations


def non_negative_floats(values: Any) -> list[float]:
    """``values`` as a list of finite floats >= 0, else ``ValueError``."""
    out = [float(v) for v in values]
    if not all(math.isfinite(v) and v >= 0.0 for v in out):
        raise ValueError("negative or non-finite value")
    return out
