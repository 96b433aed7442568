"""How many tokens to draft at each speculation step.

A policy is read by the engine at the start of every step (``next_k``) and told what happened
after it (``observe``). The UI changes a policy from another thread while a reply streams; the
change applies from the next step.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from typing import Any, Protocol

MAX_DRAFT_LENGTH = 16
LEARNT_VERSION = 1  # the layout of AutoDraftLength.learnt()
RESUME_WEIGHT = 4.0  # what an earlier run measured counts as at most this many observations


class DraftPolicy(Protocol):
    @property
    def label(self) -> str:
        """What the UI shows: the fixed K, or "auto(K)"."""
        ...

    def next_k(self) -> int: ...

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


class FixedDraftLength:
    """A draft length K set by the user (0 = plain target decoding); thread-safe."""

    def __init__(self, k: int) -> None:
        self._lock = threading.Lock()
        self._k = _checked(k)

    @property
    def label(self) -> str:
        return str(self.next_k())

    def next_k(self) -> int:
        with self._lock:
            return self._k

    def set(self, k: int) -> int:
        """Set K, clamped to 0..MAX_DRAFT_LENGTH; returns the value now in force."""
        with self._lock:
            self._k = min(max(k, 0), MAX_DRAFT_LENGTH)
            return self._k

    def adjust(self, delta: int) -> int:
        with self._lock:
            self._k = min(max(self._k + delta, 0), MAX_DRAFT_LENGTH)
            return self._k

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """A fixed policy does not adapt."""


def _checked(k: int) -> int:
    if not 0 <= k <= MAX_DRAFT_LENGTH:
        raise ValueError(f"draft length must be between 0 and {MAX_DRAFT_LENGTH}, got {k}")
    return k


# -- The adaptive policy ----------------------------------------------------------------------------

DEFAULT_KIND = "default"


class AutoDraftLength:
    """Chooses K online to maximise the expected tokens per second; thread-safe.

    The cost model, re-estimated after every step from what the engine reports to ``observe``:

    - per-position acceptance a_i = P(draft i accepted | drafts 1..i-1 accepted): accepted and
      verified counts with exponential forgetting (each observation of position i first scales its
      counts by ``forget``), shrunk towards the estimate of position i-1 (position 1 towards
      ``prior_acceptance``) with ``prior_weight`` pseudo-observations;
    - the draft cost per token: the median of the recent ``draft_s / k`` (robust to the catch-up a
      model drafter does after steps without drafting, and to a busy machine);
    - the cost of verifying n tokens (K drafts feed K + 1): a forgetting mean per n, shrunk towards
      a curve ``a + b ln(n)`` fitted to all of them (``VerifyCostModel``), non-decreasing in n.

    It drafts the K in 0..max_k maximising E[tokens | K] / (K c_draft + verify(K + 1)) with
    E[tokens | K] = 1 + sum_j prod_{i<=j} a_i (autocorrelated acceptance is in the per-position
    rates, not assumed away). K = 0 is plain decoding; leaving it needs an expected gain of
    ``switch_margin``. From K = 0 it probes at the K that would be best if acceptance were
    ``optimistic_acceptance`` (at most ``explore_k``), every ``probe_every`` steps or more: as
    many as keep the expected loss of probing (the time a probe takes minus the plain time of the
    tokens it is expected to yield, plus the catch-up a draft model does for every token it missed
    while idle, measured, ``catchup_prior`` x its per-token cost until then) under
    ``probe_budget`` of the time, a quarter of that when even optimistic acceptance could not beat
    plain decoding (a draft model too slow next to the target: the probes then only check that the
    costs it was judged on still hold). When the catch-up alone exceeds the budget (a 0.5B draft
    model on a CPU catches up at a quarter of a decode step per token), it does not probe. What was learnt before a stretch without drafting ages by
    ``stale_forget`` per step, so a probe that goes well counts. When no plain step was timed for
    ``plain_every`` steps it takes one: the one-token verification is the baseline every choice
    is weighed against. The first ``explore_steps`` drafting steps use ``explore_k``, to measure
    the drafter. The object is meant to live across turns.

    Drafters with more than one source (``ngram+model``) call ``k_for(kind, k)`` while
    ``advising()`` is true: acceptance and draft cost are then kept per kind (verification cost is
    shared). A drafter that can tell, for free, how its proposals would have fared (an n-gram
    lookup, checked against the tokens that were emitted) reports it to ``observe_shadow``; such a
    kind learns its acceptance from those reports only, needs no exploring, counts as free to draft
    until timed, and the engine keeps consulting it at K = 0 (it costs nothing), so it drafts again
    as soon as its proposals start to match.
    """

    def __init__(self, max_k: int = 8, *, prior_acceptance: float = 0.6, prior_weight: float = 2.0,
                 forget: float = 0.9, verify_forget: float = 0.95, verify_slope_prior: float = 0.8,
                 draft_cost_prior: float = 0.6, probe_every: int = 16, probe_budget: float = 0.01,
                 switch_margin: float = 0.03, optimistic_acceptance: float = 0.9,
                 explore_steps: int = 3, explore_k: int = 3, stale_forget: float = 0.98,
                 plain_every: int = 64, catchup_prior: float = 0.25) -> None:
        self.max_k = _checked(max_k)
        self.catchup_prior = catchup_prior
        self.plain_every = plain_every
        self.stale_forget = stale_forget
        self.prior_acceptance = prior_acceptance
        self.prior_weight = prior_weight
        self.forget = forget
        self.draft_cost_prior = draft_cost_prior
        self.probe_every = probe_every
        self.probe_budget = probe_budget
        self.switch_margin = switch_margin
        self.optimistic_acceptance = optimistic_acceptance
        self.explore_steps = explore_steps
        self.explore_k = min(explore_k, self.max_k)
        self._verify = VerifyCostModel(self.max_k + 1, verify_forget, verify_slope_prior)
        self._lock = threading.RLock()
        self._arms: dict[str, _Arm] = {}
        self._step = 0
        self._last_plain = -plain_every  # time plain decoding as soon as exploring is over
        self._shown_k = self.explore_k
        self._awaiting = False
        self._kind: str | None = None

    # -- DraftPolicy ----------------------------------------------------------------------------

    @property
    def label(self) -> str:
        with self._lock:
            return f"auto({self._shown_k})"

    def next_k(self) -> int:
        with self._lock:
            self._awaiting = True
            self._kind = None
            arms = list(self._arms.values())
            if not arms:
                return self.explore_k
            self._shown_k = max(self._chosen_k(arm) for arm in arms)
            if self._step - self._last_plain >= self.plain_every and not any(
                    self._exploring(arm) for arm in arms):
                return 0  # re-time plain decoding, the baseline every choice is weighed against
            return max(self._wanted_k(arm, consult=True) for arm in arms)

    def observe(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        with self._lock:
            self._awaiting = False
            self._step += 1
            self._verify.observe(k + 1, verify_s)
            if k == 0:
                self._last_plain = self._step
            kind, self._kind = self._kind or DEFAULT_KIND, None
            if k > 0:
                arm = self._arm(kind)
                arm.observe_draft(k, accepted, draft_s, self.forget, self._step, self.stale_forget)
            for arm in self._arms.values():
                self._decide(arm)

    # -- for drafters ---------------------------------------------------------------------------

    def advising(self) -> bool:
        """True between ``next_k`` and ``observe``: this policy is the one driving the step."""
        with self._lock:
            return self._awaiting

    def k_for(self, kind: str, k: int) -> int:
        """How many of the ``k`` tokens asked for the drafter should take from source ``kind``."""
        with self._lock:
            self._kind = kind
            arm = self._arm(kind)
            if arm.shadowed:
                self._decide(arm)
            return min(k, self._wanted_k(arm, consult=False))

    def observe_shadow(self, kind: str, proposed: int, matched: int) -> None:
        """A proposal of ``proposed`` tokens from ``kind`` would have had ``matched`` accepted."""
        if proposed <= 0:
            return
        with self._lock:
            arm = self._arm(kind)
            arm.shadowed = True
            arm.count_acceptance(proposed, min(matched, proposed), self.forget)

    # -- what was learnt, kept between starts -------------------------------------------------

    def learnt(self) -> dict[str, Any]:
        """What this policy has measured (verification costs; per source: acceptance counts,
        draft costs, catch-up) as plain JSON data, for ``resume`` in a later run."""
        with self._lock:
            return {"version": LEARNT_VERSION, "max_k": self.max_k,
                    "verify": self._verify.learnt(),
                    "arms": {kind: arm.learnt() for kind, arm in self._arms.items()}}

    def resume(self, learnt: dict[str, Any]) -> None:
        """Start from what an earlier policy on the same machine and models measured, instead
        of exploring: it counts as at most ``RESUME_WEIGHT`` observations of each quantity, so
        this run's own timings soon outweigh it. Raises ``ValueError`` (leaving the policy as
        it was) for data of another version or shape."""
        if learnt.get("version") != LEARNT_VERSION or learnt.get("max_k") != self.max_k:
            raise ValueError("learnt data of another version or max_k")
        verify = VerifyCostModel(self.max_k + 1, self._verify.forget, self._verify.slope_prior)
        verify.resume(learnt["verify"])
        arms = {}
        for kind, data in dict(learnt["arms"]).items():
            arm = _Arm(self.explore_k, self.probe_every)
            arm.resume(data, self.explore_steps)
            arms[str(kind)] = arm
        with self._lock:
            self._verify, self._arms = verify, arms
            for arm in arms.values():
                self._decide(arm)
            self._shown_k = max((self._chosen_k(arm) for arm in arms.values()),
                                default=self.explore_k)

    # -- introspection (tests, the bench, a stats view) -------------------------------------------

    def acceptance(self, kind: str = DEFAULT_KIND) -> list[float]:
        """Estimated acceptance at positions 1..max_k."""
        with self._lock:
            return self._acceptance(self._arm(kind))

    def verify_cost(self, n: int) -> float | None:
        """Estimated seconds to verify n tokens (None before any timing)."""
        with self._lock:
            return self._verify.predict(n)

    def expected_rates(self, kind: str = DEFAULT_KIND) -> list[float]:
        """Expected tokens per second for K = 0..max_k (empty before any timing)."""
        with self._lock:
            arm = self._arm(kind)
            return self._rates(arm, self._acceptance(arm))

    def current_k(self, kind: str = DEFAULT_KIND) -> int:
        """The K chosen for ``kind`` (probes aside)."""
        with self._lock:
            return self._chosen_k(self._arm(kind))

    # -- internals -----------------------------------------------------------------------------

    def _arm(self, kind: str) -> "_Arm":
        arm = self._arms.get(kind)
        if arm is None:
            arm = self._arms[kind] = _Arm(self.explore_k, self.probe_every)
        return arm

    def _exploring(self, arm: "_Arm") -> bool:
        return not arm.shadowed and arm.drafted_steps < self.explore_steps

    def _chosen_k(self, arm: "_Arm") -> int:
        return self.explore_k if self._exploring(arm) else arm.k

    def _wanted_k(self, arm: "_Arm", consult: bool) -> int:
        """The K for the coming step: the choice, a probe when one is due, or for a shadowed kind
        at K = 0 (``consult``) enough to make the engine ask the drafter, which learns for free."""
        k = self._chosen_k(arm)
        if k > 0 or arm.probe_k == 0:
            return k
        if arm.shadowed and arm.hopeful:
            return arm.probe_k if consult else 0
        if self._step - arm.last_drafted >= arm.probe_interval:
            return arm.probe_k
        return 0

    def _acceptance(self, arm: "_Arm") -> list[float]:
        return arm.acceptance(self.max_k, self.prior_acceptance, self.prior_weight)

    def _rates(self, arm: "_Arm", acceptance: list[float]) -> list[float]:
        verify = [self._verify.predict(n) for n in range(1, self.max_k + 2)]
        if verify[0] is None:
            return []
        draft = arm.draft_cost()
        if draft is None:  # a drafter that scores itself for free drafts for free, near enough
            draft = 0.0 if arm.shadowed else self.draft_cost_prior * verify[0]
        rates, expected, survive = [], 1.0, 1.0
        for k in range(self.max_k + 1):
            if k:
                survive *= acceptance[k - 1]
                expected += survive
            rates.append(expected / max(k * draft + verify[k], 1e-9))
        return rates

    def _decide(self, arm: "_Arm") -> None:
        if self._exploring(arm) or self.max_k == 0:
            return
        acceptance = self._acceptance(arm)
        rates = self._rates(arm, acceptance)
        if not rates:
            return
        best = max(range(1, self.max_k + 1), key=rates.__getitem__)
        needed = rates[0] * (1 + self.switch_margin) if arm.k == 0 else rates[0]
        k = best if rates[best] > needed else 0
        if k == 0:
            hopeful = self._rates(arm, [max(a, self.optimistic_acceptance) for a in acceptance])
            probe = max(range(1, self.max_k + 1), key=hopeful.__getitem__)
            # Hopeless: drafting could not pay even if it were mostly accepted. Probe anyway, but
            # seldom: the costs it was judged on may be stale.
            arm.hopeful = hopeful[probe] > rates[0] * (1 + self.switch_margin)
            if not (arm.shadowed and arm.hopeful):
                # A real probe costs what it fails to return, plus the catch-up of a drafter
                # that sat idle, which grows with the interval I: loss + catch-up x I must stay
                # within probe_budget x I plain steps.
                probe = min(probe, self.explore_k)
                plain_step = 1.0 / rates[0]
                expected = 1 + sum(_prefix_products(acceptance[:probe]))
                loss = max(0.0, expected * (1.0 / rates[probe] - plain_step))
                budget = (self.probe_budget if arm.hopeful else self.probe_budget / 4) * plain_step
                catchup = arm.catchup_per_step(self.catchup_prior)
                if catchup >= budget:
                    probe = 0  # catching up would cost more than probing may: stay plain
                else:
                    arm.probe_interval = max(self.probe_every,
                                             math.ceil(loss / (budget - catchup)))
            arm.probe_k = probe
        arm.k = k


def _non_negative_floats(values: Any) -> list[float]:
    """``values`` as a list of finite floats >= 0, else ``ValueError``."""
    out = [float(v) for v in values]
    if not all(math.isfinite(v) and v >= 0.0 for v in out):
        raise ValueError("negative or non-finite value")
    return out


def _prefix_products(values: list[float]) -> list[float]:
    """[v0, v0 v1, v0 v1 v2, ...]."""
    out, product = [], 1.0
    for value in values:
        product *= value
        out.append(product)
    return out


class _Arm:
    """What the policy knows about one source of drafts."""

    def __init__(self, k: int, probe_every: int) -> None:
        self.k = k
        self.accepted: list[float] = []
        self.verified: list[float] = []
        self.costs: deque[float] = deque(maxlen=9)
        self.drafted_steps = 0
        self.last_drafted = 0
        self.probe_k = 0
        self.probe_interval = probe_every
        self.hopeful = True  # drafting could pay if acceptance were high
        self.shadowed = False  # acceptance comes from observe_shadow, not from verified steps
        self.catchup: float | None = None  # extra draft seconds per step spent not drafting

    def learnt(self) -> dict[str, Any]:
        return {"accepted": list(self.accepted), "verified": list(self.verified),
                "costs": list(self.costs), "catchup": self.catchup, "shadowed": self.shadowed,
                "drafted_steps": self.drafted_steps}

    def resume(self, data: dict[str, Any], explore_steps: int) -> None:
        """Take ``learnt()`` data of an earlier run, its counts capped at ``RESUME_WEIGHT``."""
        verified = _non_negative_floats(data["verified"])
        accepted = _non_negative_floats(data["accepted"])
        if len(accepted) != len(verified) or any(a > v for a, v in zip(accepted, verified)):
            raise ValueError("accepted counts do not fit the verified counts")
        most = max(verified, default=0.0)
        scale = min(1.0, RESUME_WEIGHT / most) if most > 0.0 else 1.0
        self.verified = [v * scale for v in verified]
        self.accepted = [a * scale for a in accepted]
        self.costs.extend(_non_negative_floats(data["costs"])[-self.costs.maxlen:])
        catchup = data["catchup"]
        self.catchup = None if catchup is None else _non_negative_floats([catchup])[0]
        self.shadowed = bool(data["shadowed"])
        self.drafted_steps = explore_steps if int(data["drafted_steps"]) > 0 else 0

    def observe_draft(self, k: int, accepted: int, draft_s: float, forget: float,
                      step: int, stale_forget: float) -> None:
        self.drafted_steps += 1
        if not self.shadowed:  # what was learnt before a stretch without drafting has aged
            decay = stale_forget ** max(step - self.last_drafted - 1, 0)
            self.verified = [decay * v for v in self.verified]
            self.accepted = [decay * a for a in self.accepted]
        per_token = max(draft_s, 0.0) / k
        typical = self.draft_cost()
        gap = step - self.last_drafted - 1
        if typical is not None and gap > 0 and self.last_drafted > 0:
            # A model drafter that sat idle first feeds what it missed: that excess, per step.
            excess = max(0.0, draft_s - k * typical) / gap
            self.catchup = excess if self.catchup is None else 0.5 * self.catchup + 0.5 * excess
        self.last_drafted = step
        self.costs.append(per_token)
        if not self.shadowed:
            self.count_acceptance(k, accepted, forget)

    def count_acceptance(self, k: int, accepted: int, forget: float) -> None:
        while len(self.verified) < k:
            self.verified.append(0.0)
            self.accepted.append(0.0)
        for i in range(min(k, accepted + 1)):  # position i is verified when all before it passed
            self.verified[i] = forget * self.verified[i] + 1.0
            self.accepted[i] = forget * self.accepted[i] + (i < accepted)

    def acceptance(self, max_k: int, prior: float, weight: float) -> list[float]:
        rates, previous = [], prior
        for i in range(max_k):
            seen = self.verified[i] if i < len(self.verified) else 0.0
            hits = self.accepted[i] if i < len(self.accepted) else 0.0
            previous = (hits + weight * previous) / (seen + weight)
            rates.append(previous)
        return rates

    def draft_cost(self) -> float | None:
        return statistics.median(self.costs) if self.costs else None

    def catchup_per_step(self, prior: float) -> float:
        """Seconds a probe's drafter needs per step it sat idle (``prior`` x the draft cost per
        token until measured; nothing for a drafter that scores itself for free)."""
        if self.shadowed:
            return 0.0
        if self.catchup is not None:
            return self.catchup
        typical = self.draft_cost()
        return prior * typical if typical is not None else 0.0


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
        mean, weight = _non_negative_floats(data["mean"]), _non_negative_floats(data["weight"])
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
