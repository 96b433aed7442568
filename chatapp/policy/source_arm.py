"""What the adaptive draft policy (``chatapp.policy.auto.AutoDraftLength``) learns about one
source of drafts: its acceptance by position, its draft cost per token and the catch-up after
idle steps, counted as the policy reports them."""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from chatapp.policy.learnt_data import RESUME_WEIGHT, non_negative_floats
from chatapp.policy.tuning import Tuning


class SourceArm:
    """What ``AutoDraftLength`` knows about one source of drafts (its ``learnt`` and ``resume``
    give and take the per-source part of the policy's learnt data)."""

    def __init__(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self.k = tuning.first_k
        self.accepted: list[float] = []
        self.verified: list[float] = []
        self.costs: deque[float] = deque(maxlen=9)
        self.drafted_steps = 0
        self.last_drafted = 0
        self.probe_k = 0
        self.probe_interval = tuning.probe_every
        self.hopeful = True  # drafting could pay if acceptance were high
        self.shadowed = False  # acceptance comes from observe_shadow, not from verified steps
        self.catchup: float | None = None  # extra draft seconds per step spent not drafting
        self.cuts: tuple[int, ...] = ()  # DraftBudget.cuts of this source (none: uncut)

    def learnt(self) -> dict[str, Any]:
        return {"accepted": list(self.accepted), "verified": list(self.verified),
                "costs": list(self.costs), "catchup": self.catchup, "shadowed": self.shadowed,
                "drafted_steps": self.drafted_steps}

    def resume(self, data: dict[str, Any]) -> None:
        """Take ``learnt()`` data of an earlier run, its counts capped at ``RESUME_WEIGHT``."""
        verified = non_negative_floats(data["verified"])
        accepted = non_negative_floats(data["accepted"])
        if len(accepted) != len(verified) or any(a > v for a, v in zip(accepted, verified)):
            raise ValueError("accepted counts do not fit the verified counts")
        most = max(verified, default=0.0)
        scale = min(1.0, RESUME_WEIGHT / most) if most > 0.0 else 1.0
        self.verified = [v * scale for v in verified]
        self.accepted = [a * scale for a in accepted]
        self.costs.extend(non_negative_floats(data["costs"])[-self.costs.maxlen:])
        catchup = data["catchup"]
        self.catchup = None if catchup is None else non_negative_floats([catchup])[0]
        self.shadowed = bool(data["shadowed"])
        self.drafted_steps = self.tuning.explore_steps if int(data["drafted_steps"]) > 0 else 0

    def observe_draft(self, k: int, accepted: int, draft_s: float, step: int) -> None:
        """A step where this source drafted ``k`` tokens, ``accepted`` of them accepted.

        After steps without drafting, the time beyond ``k`` typical tokens is the catch-up (per
        idle step, averaged with what was known, ``catchup_prior`` x the per-token cost before
        any: one step that happened to catch up cheaply must not open the way to probes that
        catch up dearly); such a step's per-token cost is not typical and is not kept."""
        self.drafted_steps += 1
        if not self.shadowed:  # what was learnt before a stretch without drafting has aged
            decay = self.tuning.stale_forget ** max(step - self.last_drafted - 1, 0)
            self.verified = [decay * v for v in self.verified]
            self.accepted = [decay * a for a in self.accepted]
        per_token = max(draft_s, 0.0) / k
        typical = self.draft_cost()
        gap = step - self.last_drafted - 1
        self.last_drafted = step
        if typical is not None and gap > 0:
            # A model drafter that sat idle first feeds what it missed: that excess, per step.
            excess = max(0.0, draft_s - k * typical) / gap
            known = (self.tuning.catchup_prior * typical if self.catchup is None
                     else self.catchup)
            self.catchup = 0.5 * known + 0.5 * excess
        else:
            self.costs.append(per_token)
        if not self.shadowed:
            self.count_acceptance(k, accepted)

    def count_acceptance(self, k: int, accepted: int, start: int = 0,
                         settled: bool = True) -> None:
        """Count a proposal of ``k`` tokens of which the first ``accepted`` passed, from position
        ``start`` on (the positions before were counted by an earlier part of the same score);
        ``settled`` False: the positions after ``accepted`` are not decided yet and are left
        for a later part. Position i is
        verified when all before it passed; the positions after the first rejection were
        proposed but not verified: their counts age by ``unverified_forget``, faster than the
        verified ones (``forget``), so that what they say relaxes towards the positions before
        them within a few steps (acceptance at 1 fell: the old rates at 2, 3, ... learnt on
        other text are stale, and long drafts judged on them would keep failing at their first
        token)."""
        while len(self.verified) < k:
            self.verified.append(0.0)
            self.accepted.append(0.0)
        for i in range(start, k if settled else accepted):
            verified = i <= accepted
            age = self.tuning.forget if verified else self.tuning.unverified_forget
            self.verified[i] = age * self.verified[i] + verified
            self.accepted[i] = age * self.accepted[i] + (i < accepted)

    def keep_first_position(self, most: float) -> None:
        """Forget the counts of every position but the first, and those down to at most
        ``most`` observations."""
        if not self.verified:
            return
        seen = self.verified[0]
        scale = min(1.0, most / seen) if seen > 0.0 else 0.0
        self.verified = [seen * scale]
        self.accepted = [self.accepted[0] * scale]

    def acceptance(self, max_k: int, prior: float) -> list[float]:
        """The acceptance at positions 1..``max_k``, each given the positions before it were
        accepted: its counts shrunk towards the position before (position 1 towards ``prior``)
        with ``prior_weight`` pseudo-observations."""
        weight = self.tuning.prior_weight
        rates, previous = [], prior
        for i in range(max_k):
            seen = self.verified[i] if i < len(self.verified) else 0.0
            hits = self.accepted[i] if i < len(self.accepted) else 0.0
            previous = (hits + weight * previous) / (seen + weight)
            rates.append(previous)
        return rates

    def draft_cost(self) -> float | None:
        return statistics.median(self.costs) if self.costs else None

    def catchup_per_step(self, calibrated: float | None = None) -> float:
        """Seconds a probe's drafter needs per step it sat idle (``catchup_prior`` x the draft
        cost per token until measured, the ``calibrated`` one before it drafted; nothing for a
        drafter that scores itself for free)."""
        if self.shadowed:
            return 0.0
        if self.catchup is not None:
            return self.catchup
        typical = self.draft_cost()
        if typical is None:
            typical = calibrated
        return self.tuning.catchup_prior * typical if typical is not None else 0.0
