"""The adaptive draft policy: chooses each source's draft length online from measured costs and
acceptance, to maximise expected tokens per second on this machine.

The engine asks it for a ``DraftBudget`` per step and reports a ``StepOutcome`` after it; that is
all it knows of drafters and the engine.
"""

from __future__ import annotations

import math
import threading
from itertools import accumulate
from typing import Any

from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import (
    MODEL_SOURCE,
    PREDICTION_SOURCE,
    DraftBudget,
    ShadowScore,
    StepOutcome,
    source_family,
)
from chatapp.policy.source_arm import SourceArm
from chatapp.policy.tuning import Tuning
from chatapp.policy.verify_cost import VerifyCostModel

# The layout of AutoDraftLength.learnt() (3: free sources draft up to free_max_k)
LEARNT_VERSION = 3


class AutoDraftLength:
    """Chooses K online to maximise the expected tokens per second; thread-safe.

    The cost model, re-estimated after every step from what the engine reports to ``observe``:

    - per-position acceptance a_i = P(draft i accepted | drafts 1..i-1 accepted): accepted and
      verified counts with exponential forgetting (each observation of position i first scales its
      counts by ``forget``), shrunk towards the estimate of position i-1 (position 1 towards
      ``prior_acceptance``) with ``prior_weight`` pseudo-observations;
    - the draft cost per token: the median of the recent ``draft_s / k`` (robust to the catch-up a
      model drafter does after steps without drafting, and to a busy machine);
    - the cost of verifying n tokens (K drafts feed K + 1): a forgetting mean per n as measured,
      with no form imposed (4 tokens may cost less than 3); an n never measured is extrapolated on
      the cheap side, so that it is tried once and then known (``VerifyCostModel``); for a free
      source, while verifying never-timed n has lost at most ``explore_budget`` of the time, an
      n between measured ones is guessed as cheap as the measured one below it, so that a batch
      size cheaper than its neighbours (16 tokens on the CPU of docs/benchmarks.md) is found;
    - the tokens per second achieved over the recent steps, the yardstick a K is weighed against.

    It drafts the K in 0..max_k (0..free_max_k for a source that scores itself for free: its
    proposals cost nothing to make, so only verification limits their length) maximising
    E[tokens | K] - R x (K c_draft + verify(K + 1)), R the throughput achieved (kept between the
    plain rate and this source's best rate; see ``_best_k``), with
    E[tokens | K] = 1 + sum_j prod_{i<=j} a_i (autocorrelated acceptance is in the per-position
    rates, not assumed away). K = 0 is plain decoding; leaving it needs an expected gain of
    ``switch_margin``, and the catch-up of a drafter that sat idle repaid within
    ``switch_horizon`` steps. From K = 0 it probes at the K that would be best if acceptance were
    ``optimistic_acceptance`` (at most ``explore_k``), every ``probe_every`` steps or more: as
    many as keep the expected loss of probing (the time a probe takes minus the plain time of the
    tokens it is expected to yield, plus the catch-up a draft model does for every token it missed
    while idle, measured, ``catchup_prior`` x its per-token cost until then) under
    ``probe_budget`` of the time, a quarter of that when even optimistic acceptance could not beat
    plain decoding (a draft model too slow next to the target: the probes then only check that the
    costs it was judged on still hold). When the catch-up alone exceeds the budget (a 0.5B draft
    model on a CPU catches up at a quarter of a decode step per token), it does not probe. What was
    learnt before a stretch without drafting ages by ``stale_forget`` per step, so a probe that
    goes well counts. When no plain step was timed for ``plain_every`` steps it takes one: the
    one-token verification is the baseline every choice is weighed against. An
    uncalibrated policy's first ``explore_steps`` drafting steps use ``explore_k``, to measure
    the drafter; a calibrated one's first draft of a hopeful draft model does. The object is
    meant to live across turns.

    Acceptance and draft cost are kept per source (the ``source`` of each ``StepOutcome``; the
    budget gives each source its own K; verification cost is shared). A drafter that can tell,
    for free, how its proposals would have fared (an n-gram lookup, checked against the tokens
    that were emitted) sends ``ShadowScore``s with its proposals; such a source learns its
    acceptance from those only, needs no exploring, counts as free to draft until timed, and the
    budget keeps ``consult`` set while it sits at K = 0 (asking it costs nothing), so it drafts
    again as soon as its proposals start to match; it tells each position of a proposal as soon
    as an emitted token decides it, so a run that is matching counts before it ends.

    Exploring is bounded per reply: once the drafting steps of this reply have lost more than
    ``loss_budget`` of its time against plain decoding of the tokens they emitted, a source is
    judged on ``deficit_prior`` instead of ``prior_acceptance`` until its gains bring the reply
    back within the budget, so a reply where source after source (an edit tracker's kinds, the
    lookups', the history's) tries its first drafts on the prior cannot pay for each of them.
    Names in the description above are the fields of its ``Tuning`` (``chatapp.policy.tuning``),
    held by the policy and each source's arm.
    """

    def __init__(self, tuning: Tuning = Tuning()) -> None:
        self.tuning = tuning
        self._verify = VerifyCostModel(tuning.longest_free + 1, tuning.verify_forget,
                                       tuning.verify_slope_prior)
        self._lock = threading.RLock()
        self._arms: dict[str, SourceArm] = {}
        self._step = 0
        self._tokens = 0.0  # tokens emitted and seconds spent, forgetting by throughput_forget
        self._seconds = 0.0
        self._last_plain = -tuning.plain_every  # time plain decoding once exploring is over
        self._spent_s = 0.0  # all verification time, and that of batch sizes never timed before
        self._exploring_s = 0.0
        self._draft_token: float | None = None  # a draft-model token's calibrated cost
        self._new_ks = (tuning.first_k, tuning.first_k)  # model's and a free source's, unrecorded
        self._new_free_cuts: tuple[int, ...] = ()  # and the cuts of the free source's proposals
        self._new_ks_known = False  # whether _new_ks were decided on calibrated costs
        self._turn_s = 0.0  # this reply's seconds, and what its drafting steps lost against
        self._turn_lost_s = 0.0  # plain decoding of the tokens they emitted (negative: gained)

    @property
    def max_k(self) -> int:
        """The longest draft of a draft model (``Tuning.max_k``)."""
        return self.tuning.max_k

    @property
    def free_max_k(self) -> int:
        """The longest draft of a free source (``Tuning.longest_free``)."""
        return self.tuning.longest_free

    @property
    def explore_k(self) -> int:
        """The K a draft model explores with (``Tuning.first_k``)."""
        return self.tuning.first_k

    # -- DraftPolicy ----------------------------------------------------------------------------

    adaptive = True

    def budget(self) -> DraftBudget:
        with self._lock:
            arms = self._arms
            if not arms and not self._verify.calibrated:
                return DraftBudget.uniform(self.explore_k)
            if self._step - self._last_plain >= self.tuning.plain_every and not any(
                    self._exploring(arm) for arm in arms.values()):
                # re-time plain decoding, the baseline of every choice
                return DraftBudget.uniform(0)
            by_source = {kind: self._wanted_k(arm) for kind, arm in arms.items()}
            cuts = {kind: arm.cuts for kind, arm in arms.items() if arm.cuts}
            if not self._verify.calibrated:  # a new source is explored
                consult = any(self._consulting(arm) for arm in arms.values())
                return DraftBudget(by_source, self.explore_k, consult, cuts)
            model_k, free_k = self._new_ks
            if MODEL_SOURCE not in arms:
                by_source[MODEL_SOURCE] = model_k
            # a source never seen drafts what a free source with no record would, cut as it
            # would be: the costs decide (asking the drafter costs nothing, and it scores its
            # proposals)
            return DraftBudget(by_source, free_k, True, cuts, self._new_free_cuts)

    def observe(self, outcome: StepOutcome) -> None:
        with self._lock:
            for score in outcome.scores:
                self._observe_shadow(score)
            k = outcome.drafted
            self._step += 1
            forget = self.tuning.throughput_forget
            seconds = max(outcome.draft_s + outcome.verify_s, 0.0)
            self._tokens = forget * self._tokens + outcome.accepted + 1
            self._seconds = forget * self._seconds + seconds
            self._count_exploring(k + 1, outcome.accepted + 1, outcome.verify_s)
            self._verify.observe(k + 1, outcome.verify_s)
            touched = {score.source for score in outcome.scores}
            prior_changed = self._count_turn(k, outcome.accepted + 1, seconds)
            if k == 0:
                self._last_plain = self._step
            else:
                kind = outcome.source or MODEL_SOURCE
                touched.add(kind)
                self._arm(kind).observe_draft(k, outcome.accepted, outcome.draft_s, self._step)
            self._redecide(touched, everyone=prior_changed)

    def _redecide(self, touched: set[str], everyone: bool = False) -> None:
        """Decide again for the sources ``touched`` by the latest step (what was learnt of them
        changed), and for all, seen or not, when ``everyone`` (what they are judged on changed)
        and every ``redecide_every`` steps (costs and throughput move slowly); keep what a
        source with no record would draft (``_new_ks``)."""
        everyone = everyone or self._step % self.tuning.redecide_every == 0
        for kind, arm in self._arms.items():
            if everyone or kind in touched:
                self._decide(arm)
        if everyone or not self._new_ks_known:
            free = self._new_arm(shadowed=True)
            self._new_ks = self._chosen_k(self._new_arm(shadowed=False)), self._chosen_k(free)
            self._new_free_cuts = free.cuts
            self._new_ks_known = self._verify.calibrated

    def start_turn(self) -> None:
        """A new reply: the acceptance learnt before counts ``turn_forget`` as much for the
        draft model and for a reply's predicted output, and of a source that scores itself for
        free only the first position's is kept, as at most ``free_turn_memory`` observations
        (another prompt may be another kind of text: runs learnt on code must give way at once
        on prose, but a kind that kept failing need not fail again first; a prediction is the
        client's word on the reply, as it was on the last one; the costs, the machine's, are
        kept)."""
        with self._lock:
            self._turn_s = self._turn_lost_s = 0.0
            for kind, arm in self._arms.items():
                if not arm.shadowed or source_family(kind) == PREDICTION_SOURCE:
                    arm.verified = [self.tuning.turn_forget * v for v in arm.verified]
                    arm.accepted = [self.tuning.turn_forget * a for a in arm.accepted]
                else:
                    arm.keep_first_position(self.tuning.free_turn_memory)
            self._redecide(set(self._arms))

    def calibrate(self, calibration: Calibration) -> None:
        """Start from this machine's measured costs (``chatapp.engine.calibration``): the
        verification of every n, and the draft model's cost per token. A calibrated policy
        drafts from its first step only where the costs say it can pay: it never explores a
        batch size, and tries a draft model only where drafting could beat plain decoding if
        it were mostly accepted."""
        with self._lock:
            self._verify.calibrate(calibration.verify)
            self._draft_token = calibration.draft_token
            self._redecide(set(), everyone=True)

    def _count_turn(self, drafted: int, emitted: int, seconds: float) -> bool:
        """Add a step of ``seconds`` to this reply's time and, for a drafting step, what it lost
        against plain decoding of the ``emitted`` tokens (``_lost_to_plain``); True when that
        moved the reply into or out of deficit (``_in_deficit``: the prior changed)."""
        was = self._in_deficit()
        self._turn_s += seconds
        lost = self._lost_to_plain(emitted, seconds)
        if drafted and lost is not None:
            self._turn_lost_s += lost
        return self._in_deficit() != was

    def _in_deficit(self) -> bool:
        """Whether this reply's drafting has lost more than ``loss_budget`` of its time against
        plain decoding: exploring is bounded by what it costs, so from there on a source drafts
        only on the acceptance it showed in this reply (``deficit_prior`` before it), until its
        gains bring the reply back within the budget."""
        return self._turn_lost_s > self.tuning.loss_budget * self._turn_s

    def _count_exploring(self, n: int, emitted: int, seconds: float) -> None:
        """Add a verification of ``n`` tokens that emitted ``emitted`` to the time spent and,
        when ``n`` was never timed before, what it lost against plain decoding of those tokens
        to the time spent exploring."""
        seconds = max(seconds, 0.0)
        self._spent_s += seconds
        lost = self._lost_to_plain(emitted, seconds)
        if not self._verify.ever_measured(n) and lost is not None:
            self._exploring_s += max(0.0, lost)

    def _lost_to_plain(self, emitted: int, seconds: float) -> float | None:
        """How much longer than plain decoding of its ``emitted`` tokens a step of ``seconds``
        took, at the one-token verification's estimated cost (negative: it gained; None before
        any timing)."""
        plain = self._verify.predict(1)
        return None if plain is None else seconds - emitted * plain

    def _may_explore(self) -> bool:
        """Whether a free source may still be offered batch sizes never timed at a cheap guess
        of their cost (while what exploring lost is within ``explore_budget`` of the time)."""
        return self._exploring_s <= self.tuning.explore_budget * self._spent_s

    def _observe_shadow(self, score: ShadowScore) -> None:
        """A free proposal from ``score.source`` would have had ``score.matched`` accepted."""
        if score.proposed <= 0:
            return
        arm = self._arm(score.source)
        arm.shadowed = True
        arm.count_acceptance(score.proposed, min(score.matched, score.proposed), score.start,
                             score.settled)

    # -- what was learnt, kept between starts -------------------------------------------------

    def learnt(self) -> dict[str, Any]:
        """What this policy has measured (verification costs; per source: acceptance counts,
        draft costs, catch-up) as plain JSON data, for ``resume`` in a later run."""
        with self._lock:
            return {"version": LEARNT_VERSION, "max_k": self.max_k, "free_max_k": self.free_max_k,
                    "verify": self._verify.learnt(),
                    "arms": {kind: arm.learnt() for kind, arm in self._arms.items()}}

    def resume(self, learnt: dict[str, Any]) -> None:
        """Start from what an earlier policy on the same machine and models measured, instead
        of exploring: it counts as at most ``RESUME_WEIGHT`` observations of each quantity, so
        this run's own timings soon outweigh it. Raises ``ValueError`` (leaving the policy as
        it was) for data of another version or shape."""
        if (learnt.get("version") != LEARNT_VERSION or learnt.get("max_k") != self.max_k
                or learnt.get("free_max_k") != self.free_max_k):
            raise ValueError("learnt data of another version or max_k")
        verify = VerifyCostModel(self.free_max_k + 1, self._verify.forget,
                                 self._verify.slope_prior)
        verify.resume(learnt["verify"])
        verify.take_calibration(self._verify)
        arms = {}
        for kind, data in dict(learnt["arms"]).items():
            arm = SourceArm(self.tuning)
            arm.resume(data)
            arms[str(kind)] = arm
        with self._lock:
            self._verify, self._arms = verify, arms
            for arm in arms.values():
                self._decide(arm)

    # -- introspection (tests, the bench, a stats view) -------------------------------------------

    def acceptance(self, kind: str = MODEL_SOURCE) -> list[float]:
        """Estimated acceptance at positions 1..K, K the longest draft ``kind`` may make."""
        with self._lock:
            return self._acceptance(self._arm(kind))

    def verify_cost(self, n: int) -> float | None:
        """Estimated seconds to verify n tokens (None before any timing)."""
        with self._lock:
            return self._verify.predict(n)

    def expected_rates(self, kind: str = MODEL_SOURCE) -> list[float]:
        """Expected tokens per second for K = 0.. the longest draft of ``kind`` (empty before any
        timing)."""
        with self._lock:
            arm = self._arm(kind)
            return self._rates(arm, self._acceptance(arm))

    def current_k(self, kind: str | None = None) -> int:
        """The K chosen for ``kind`` (probes aside); None: the longest any source drafts (before
        any source is known, the K it explores with)."""
        with self._lock:
            if kind is None:
                return max((self._chosen_k(arm) for arm in self._arms.values()),
                           default=self.explore_k)
            return self._chosen_k(self._arm(kind))

    # -- internals -----------------------------------------------------------------------------

    def _arm(self, kind: str) -> SourceArm:
        arm = self._arms.get(kind)
        if arm is None:
            arm = self._arms[kind] = SourceArm(self.tuning)
        return arm

    def _exploring(self, arm: SourceArm) -> bool:
        """Whether ``arm``'s next draft explores it, at ``explore_k``: a draft model's first
        ``explore_steps`` before calibration (they measure its cost), or, once calibrated (its
        cost is known), its first draft only, where drafting could pay if it were mostly
        accepted (``_hopeful``); that draft's acceptance then decides like any other."""
        if arm.shadowed or arm.drafted_steps >= self.tuning.explore_steps:
            return False
        if not self._verify.calibrated:
            return True
        return arm.drafted_steps == 0 and self._hopeful(arm)

    def _hopeful(self, arm: SourceArm) -> bool:
        """Whether some K would beat plain decoding by ``switch_margin`` and repay the catch-up
        of a drafter that sat idle (``_catchup_share``) if ``arm``'s drafts were accepted at
        ``optimistic_acceptance`` at least."""
        acceptance = [max(a, self.tuning.optimistic_acceptance) for a in self._acceptance(arm)]
        tokens, seconds = self._outlook(arm, acceptance)
        if len(tokens) < 2:
            return False
        plain_rate = tokens[0] / seconds[0]
        catchup = self._catchup_share(arm)
        return any(tokens[k] - plain_rate * seconds[k]
                   > (self.tuning.switch_margin * seconds[k] + catchup) * plain_rate
                   for k in range(1, len(tokens)))

    def _catchup_share(self, arm: SourceArm) -> float:
        """Seconds per step, over ``switch_horizon`` steps, of the catch-up ``arm``'s drafter
        must do before drafting: it feeds what it missed since it last drafted (at most a
        horizon's worth: it catches up on the current context only), a horizon's worth when it
        never drafted (it lacks the whole conversation); nothing for a free source."""
        horizon = self.tuning.switch_horizon
        idle = horizon if arm.drafted_steps == 0 else min(self._step - arm.last_drafted, horizon)
        return arm.catchup_per_step(self._draft_token_now()) * idle / horizon

    def _draft_token_now(self) -> float | None:
        """The draft model's calibrated cost per token scaled as the target's costs are now
        (``VerifyCostModel.load``: a slow moment makes both dearer, and must not make drafting
        look cheaper); None without a calibration."""
        if self._draft_token is None:
            return None
        return self._draft_token * self._verify.load()

    def _new_arm(self, shadowed: bool) -> SourceArm:
        """A source with no record yet, decided on: a draft model (``shadowed`` False) or a
        source that scores itself for free."""
        arm = SourceArm(self.tuning)
        arm.shadowed = shadowed
        self._decide(arm)
        return arm

    def _chosen_k(self, arm: SourceArm) -> int:
        return self.explore_k if self._exploring(arm) else arm.k

    def _wanted_k(self, arm: SourceArm) -> int:
        """The K for the coming step: the choice, or a probe when one is due."""
        k = self._chosen_k(arm)
        if k > 0 or arm.probe_k == 0 or (arm.shadowed and arm.hopeful):
            return k
        if self._step - arm.last_drafted >= arm.probe_interval:
            return arm.probe_k
        return 0

    def _consulting(self, arm: SourceArm) -> bool:
        """A shadowed kind at K = 0 that could pay again: the drafter is asked anyway, so that it
        scores its proposals for free and the kind drafts again as soon as they match."""
        return self._chosen_k(arm) == 0 and arm.probe_k > 0 and arm.shadowed and arm.hopeful

    def _longest(self, arm: SourceArm) -> int:
        """The longest draft ``arm`` may make: ``free_max_k`` for a source that scores itself for
        free (its one-hot proposals cost nothing to make, so only verification limits them),
        ``max_k`` for a draft model."""
        return self.free_max_k if arm.shadowed else self.max_k

    def _acceptance(self, arm: SourceArm) -> list[float]:
        """Estimated acceptance at positions 1..``_longest(arm)``."""
        return arm.acceptance(self._longest(arm), self._prior())

    def _prior(self) -> float:
        """The acceptance at position 1 assumed before a source's own observations:
        ``prior_acceptance``, or ``deficit_prior`` while this reply's drafting has lost more
        than it may (``_in_deficit``)."""
        return self.tuning.deficit_prior if self._in_deficit() else self.tuning.prior_acceptance

    def _rates(self, arm: SourceArm, acceptance: list[float]) -> list[float]:
        """Expected tokens per second of a step at K = 0..len(acceptance) (empty before any
        timing)."""
        outlook = self._outlook(arm, acceptance)
        return [tokens / seconds for tokens, seconds in zip(*outlook)]

    def _outlook(self, arm: SourceArm, acceptance: list[float]) -> tuple[list[float], list[float]]:
        """Expected tokens and seconds of a step at K = 0..len(acceptance) (empty before any
        timing)."""
        longest = len(acceptance)
        if self._verify.predict(1) is None:
            return [], []
        explore = arm.shadowed and self._may_explore()
        verify = self._verify.curve(explore)[:longest + 1]
        draft = arm.draft_cost()
        if draft is None and arm.shadowed:  # a drafter that scores itself for free drafts for
            draft = 0.0  # free, near enough
        elif draft is None:
            calibrated = self._draft_token_now()
            draft = calibrated if calibrated is not None else (
                self.tuning.draft_cost_prior * verify[0])
        tokens = [1.0 + expected for expected in accumulate(_prefix_products(acceptance),
                                                             initial=0.0)]
        seconds = [max(k * draft + verify[k], 1e-9) for k in range(longest + 1)]
        return tokens, seconds

    def _best_k(self, arm: SourceArm, acceptance: list[float]) -> tuple[int, list[float]]:
        """The K in 0..len(acceptance) to draft, and the rates of ``_rates``.

        Each K is worth the tokens it yields less what its time would yield at the throughput
        achieved (``E_K - R T_K``, Dinkelbach's criterion): a source drafts only where it has a
        proposal, so a longer draft that covers more text at the source's good rate can beat the
        K with the best rate of its own. With one source, R converges to that source's best rate
        and the criterion to the best E_K / T_K. R is kept between the rate of plain decoding
        (always within reach; slow exploring steps must not make drafting look cheap) and the best
        rate of this source's steps (a lucky run must not make every draft look too slow), so a K
        is never shorter than the one with the best rate. Leaving K = 0 needs ``switch_margin`` x
        the plain tokens of the drafting step's time more, and a drafter that must first catch up
        on the steps it sat idle (``switch_horizon`` at most) must repay that within
        ``switch_horizon`` steps."""
        tokens, seconds = self._outlook(arm, acceptance)
        rates = [t / s for t, s in zip(tokens, seconds)]
        measured = self._throughput()
        throughput = max(rates) if measured is None else min(max(measured, rates[0]), max(rates))
        values = [t - throughput * s for t, s in zip(tokens, seconds)]
        best = max(range(1, len(values)), key=values.__getitem__)
        needed = 0.0
        if arm.k == 0:
            needed = (self.tuning.switch_margin * seconds[best] + self._catchup_share(arm)
                      ) * rates[0]
        k = best if values[best] - values[0] > needed else 0
        arm.cuts = _cuts(values[:k + 1]) if k and self._verify.calibrated else ()
        return k, rates

    def _throughput(self) -> float | None:
        """Tokens per second achieved over the recent steps (None before any timing)."""
        return self._tokens / self._seconds if self._seconds > 0.0 else None

    def _decide(self, arm: SourceArm) -> None:
        if self._exploring(arm) or self.max_k == 0:
            return
        acceptance = self._acceptance(arm)
        if self._verify.predict(1) is None:
            return
        k, rates = self._best_k(arm, acceptance)
        if k == 0:
            optimistic = self.tuning.optimistic_acceptance
            hopeful = self._rates(arm, [max(a, optimistic) for a in acceptance])
            probe = max(range(1, len(hopeful)), key=hopeful.__getitem__)
            # Hopeless: drafting could not pay even if it were mostly accepted. Probe anyway, but
            # seldom: the costs it was judged on may be stale.
            arm.hopeful = hopeful[probe] > rates[0] * (1 + self.tuning.switch_margin)
            if not (arm.shadowed and arm.hopeful):
                # A real probe costs what it fails to return, plus the catch-up of a drafter
                # that sat idle, which grows with the interval I: loss + catch-up x I must stay
                # within probe_budget x I plain steps.
                probe = min(probe, self.explore_k)
                plain_step = 1.0 / rates[0]
                expected = 1 + sum(_prefix_products(acceptance[:probe]))
                loss = max(0.0, expected * (1.0 / rates[probe] - plain_step))
                share = self.tuning.probe_budget if arm.hopeful else self.tuning.probe_budget / 4
                budget = share * plain_step
                catchup = arm.catchup_per_step(self._draft_token_now())
                if catchup >= budget:
                    probe = 0  # catching up would cost more than probing may: stay plain
                else:
                    arm.probe_interval = max(self.tuning.probe_every,
                                             math.ceil(loss / (budget - catchup)))
            arm.probe_k = probe
        arm.k = k


def _cuts(values: list[float]) -> tuple[int, ...]:
    """For a proposal of m = 0..len(values) - 1 tokens, the n <= m with the largest value: how
    much of a proposal shorter than the K chosen to draft (a source that ran out) is worth
    verifying, so that it ends on a batch size that is cheap here (0: none of it)."""
    cuts, best = [], 0
    for m, value in enumerate(values):
        if value > values[best]:
            best = m
        cuts.append(best)
    return tuple(cuts)


def _prefix_products(values: list[float]) -> list[float]:
    """[v0, v0 v1, v0 v1 v2, ...]."""
    out, product = [], 1.0
    for value in values:
        product *= value
        out.append(product)
    return out
