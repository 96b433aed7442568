"""The automatic draft length's tuning: one frozen value held by ``AutoDraftLength`` and by each
source's ``SourceArm``.

Nothing changes it at run time. The defaults are the values the policy was written and checked
with: the simulated machines of tests/test_draft_policy.py and tests/test_auto_simulation.py (CPUs'
measured verification costs, with and without AMX, and a flat GPU-like profile) and the bench on
the default pair (docs/benchmarks.md). Each rule is documented on the method that applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.engine.contracts import LONGEST_FREE_DRAFT, checked_draft_length


@dataclass(frozen=True)
class Tuning:
    """The constants of the automatic draft length (see the module docstring)."""

    max_k: int = 8  # the longest draft of a draft model
    free_max_k: int = LONGEST_FREE_DRAFT  # of a free source: as long as its shadow look-ahead (8
    # was measured worse on the code-edit prompts: 1.08-1.37x against 1.07-1.71x)
    explore_steps: int = 3  # an uncalibrated draft model's first drafting steps, made at
    # explore_k to measure it (a calibrated one's cost is known: it explores with one)
    explore_k: int = 3
    catchup_prior: float = 0.25  # an idle draft model catches up on a missed token at this x its
    # per-token cost, until measured
    prior_acceptance: float = 0.55  # acceptance assumed at position 1 before any observation
    # (0.6 cost Q&A 2% in the replay of docs/benchmarks.md, 0.5 the held-out edits 3%)
    loss_budget: float = 0.02  # a reply's drafting may lose at most this share of its time
    # against plain decoding before sources are judged on ``deficit_prior`` (free sources' short
    # drafts on prose and Q&A cost 3-5% on the EPYC of docs/benchmarks.md without it)
    deficit_prior: float = 0.3  # the acceptance assumed at position 1 while over that budget
    prior_weight: float = 2.0  # pseudo-observations shrinking position i's rate towards i-1's
    forget: float = 0.95  # per-observation forgetting of acceptance counts (about the last 20
    # steps count; 0.9 let the estimates swing enough to cost 5% on the simulated GPU)
    unverified_forget: float = 0.9  # per proposal, of the positions after its first rejection:
    # about 10 first-token failures relax them to the positions before them (0.95 took 45: a
    # source whose deep positions were learnt on code kept drafting 15 tokens on prose, 0.85x)
    turn_forget: float = 0.5  # at a new reply, the weight of the acceptance learnt before it: the
    # draft model's, and a predicted output's (the family PREDICTION_SOURCE)
    free_turn_memory: float = 2.0  # and of a free source's, only its first position's, as at
    # most this many observations: it relearns the rest within a few steps at no cost (keeping
    # all at 0.5 drafted 15 tokens learnt on code edits on the next prose reply: 0.88x), and a
    # kind that kept failing is not tried on the prior again in every reply
    verify_forget: float = 0.95  # per-observation forgetting of verification timings
    verify_slope_prior: float = 0.8  # n tokens ~ one token x (1 + 0.8 ln n) until measured
    draft_cost_prior: float = 0.6  # a draft token costs this x a one-token verification until
    # timed or calibrated
    probe_every: int = 16  # at least this many steps between probes while not drafting
    probe_budget: float = 0.01  # probing may cost at most 1% of the time
    switch_margin: float = 0.03  # leaving plain decoding needs an expected gain of 3%
    optimistic_acceptance: float = 0.9  # the acceptance a probe is sized for
    stale_forget: float = 0.98  # per idle step, what was learnt before a stretch without
    # drafting ages
    plain_every: int = 64  # re-time plain decoding when none was timed for this many steps
    redecide_every: int = 8  # steps between decisions for the sources no step touched
    switch_horizon: int = 64  # steps a switch to drafting is expected to last
    throughput_forget: float = 0.99  # per-step forgetting of the tokens/s achieved (~100 steps)
    explore_budget: float = 0.02  # verifying batch sizes never timed may lose at most this share
    # of the time (uncalibrated only)

    def __post_init__(self) -> None:
        checked_draft_length(self.max_k)

    @property
    def longest_free(self) -> int:
        """The longest draft of a free source: ``free_max_k``, never below ``max_k``; none when
        drafting is off (``max_k`` 0)."""
        return max(self.free_max_k, self.max_k) if self.max_k else 0

    @property
    def first_k(self) -> int:
        """The K a draft model explores with (``explore_k``, at most ``max_k``)."""
        return min(self.explore_k, self.max_k)
