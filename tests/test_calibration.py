"""The machine's costs measured before the first reply, kept per machine and setup, and what a
calibrated policy does with them (chatapp.engine.calibration, chatapp.policy)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chatapp.assembly.loader import ensure_calibration
from chatapp.backends.fake import FakeBackend
from chatapp.engine.calibration import Calibration, measure
from chatapp.engine.contracts import DraftBudget, Proposal
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.policy import measurements as memory
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.verify_cost import VerifyCostModel
from chatapp.settings.config import Config


class CountingBackend(FakeBackend):
    """A fake model that counts its evaluations."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluations = 0

    def evaluate(self, tokens, n_logits):
        self.evaluations += 1
        return super().evaluate(tokens, n_logits)


def test_measure_times_every_size_and_the_draft_token_leaving_the_context_cached() -> None:
    target, draft = FakeBackend(), FakeBackend()
    context = [1, 2, 3, 4, 5]
    costs = measure(target, context, 17, draft)
    assert sorted(costs.verify) == list(range(1, 18))
    assert all(s >= 0.0 for s in costs.verify.values())
    assert costs.draft_token is not None
    assert list(target.cached_tokens) == context
    assert list(draft.cached_tokens) == context


def test_calibration_data_round_trips_and_refuses_what_is_not_a_cost() -> None:
    costs = Calibration({1: 0.05, 2: 0.08}, 0.02)
    assert Calibration.from_data(costs.as_data()) == costs
    for bad in ({"verify": {}}, {"verify": {"0": 0.1}}, {"verify": {"1": -1.0}},
                {"verify": {"1": "nan"}}, {"verify": {"1": 0.1}, "draft_token": 1e9}):
        with pytest.raises(ValueError):
            Calibration.from_data(bad)


def test_a_calibrated_cost_model_predicts_the_curve_scaled_by_the_load() -> None:
    model = VerifyCostModel(4)
    model.calibrate({1: 0.05, 2: 0.08, 3: 0.12, 4: 0.10})
    assert model.calibrated
    assert model.predict(4) == pytest.approx(0.10)  # no smooth fit: 4 is cheaper than 3
    for _ in range(5):
        model.observe(1, 0.10)  # the machine is twice as slow now
    assert model.predict(1) == pytest.approx(0.10)
    assert model.predict(3) == pytest.approx(0.24, rel=0.05)


def test_one_slow_timing_of_a_cheap_batch_size_does_not_hide_it() -> None:
    """The cost curve of docs/benchmarks.md: 16 tokens verify cheaper than 15 or 17. A first
    16-token step that happens to take 1.5x its calibrated cost must not make 17 look cheaper
    (the policy would then never verify 16 again); many such timings are the truth, and win."""
    model = VerifyCostModel(17)
    model.calibrate({n: 0.025 + 0.01 * (n - 1) for n in range(1, 18)} | {16: 0.14})
    for _ in range(20):
        model.observe(1, 0.025)
    model.observe(16, 0.21)
    assert model.predict(16) < model.predict(15) < model.predict(17)
    for _ in range(10):
        model.observe(16, 0.21)
        model.observe(1, 0.025)
    assert model.predict(16) == pytest.approx(0.21, rel=0.05)


def test_ensure_calibration_measures_once_per_setup_and_machine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = Config(target="fake", drafter="ngram")
    target = CountingBackend()
    first = ensure_calibration(config, target, None)
    measured = target.evaluations
    assert measured > 17  # every size, twice
    assert ensure_calibration(config, target, None) == first
    assert target.evaluations == measured  # kept, not measured again
    other = dataclasses.replace(config, threads=1)
    ensure_calibration(other, target, None)
    assert target.evaluations > measured  # another setup is measured afresh


def test_a_policy_recalls_the_calibration_kept_beside_its_memory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = memory.memory_path(["setup"])
    memory.remember_calibration(Calibration({n: 0.01 * n for n in range(1, 18)}), path)
    policy = AutoDraftLength()
    assert not memory.recall(policy, path)  # nothing learnt yet...
    assert policy.verify_cost(16) == pytest.approx(0.16)  # ...but the costs are known


def test_the_memory_of_another_cpu_is_never_applied(monkeypatch) -> None:
    here = memory.memory_path(["setup"])
    monkeypatch.setattr(memory, "cpu_description", lambda: "Another CPU (AVX2)")
    assert memory.memory_path(["setup"]) != here
    monkeypatch.setenv("SPECCHAT_AMX", "off")
    monkeypatch.setattr(memory, "cpu_description", lambda: "x")
    without_amx = memory.memory_path(["setup"])
    monkeypatch.delenv("SPECCHAT_AMX")
    assert memory.memory_path(["setup"]) != without_amx


def test_a_proposal_is_cut_to_what_the_budget_says_for_its_length() -> None:
    budget = DraftBudget({"ngram": 15}, 0, cuts={"ngram": (0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3,
                                                           3, 3, 3, 15)})
    assert budget.cut("ngram", 7) == 3
    assert budget.cut("ngram", 15) == 15
    assert budget.cut("edit", 7) == 7  # no table: uncut
    assert budget.capped(10).cuts == budget.cuts
    proposal = Proposal.one_hot([5, 6, 7, 8], 10, "ngram")
    assert proposal.cut(3).tokens == [5, 6, 7]
    assert proposal.cut(0).tokens == [] and proposal.cut(0).source == ""
    rows = np.full((2, 10), 0.1)
    assert Proposal([1, 2], rows, "model").cut(1).probs.shape == (1, 10)


class FixedProposals:
    """A drafter that always proposes the same tokens."""

    name = "fixed"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def prefill(self, context, hints) -> None:
        pass

    def propose(self, context, budget, params, rng) -> Proposal:
        tokens = self.tokens[:budget.for_source("ngram")]
        return Proposal.one_hot(tokens, FakeBackend().vocab_size, "ngram")

    def score_emitted(self, context) -> tuple:
        return ()

    def rollback(self, context, verified) -> None:
        pass

    def close(self) -> None:
        pass


class CuttingPolicy:
    """Budgets 8 tokens and cuts a proposal of 5 to 2."""

    adaptive = True

    def __init__(self) -> None:
        self.drafted: list[int] = []

    def current_k(self) -> int:
        return 8

    def budget(self) -> DraftBudget:
        return DraftBudget({"ngram": 8}, 0, cuts={"ngram": (0, 1, 2, 3, 4, 2)})

    def observe(self, outcome) -> None:
        self.drafted.append(outcome.drafted)

    def start_turn(self) -> None:
        pass


def test_the_engine_verifies_the_cut_proposal() -> None:
    engine = SpeculativeEngine(FakeBackend(), FixedProposals([1, 2, 3, 4, 5]))
    policy = CuttingPolicy()
    list(engine.generate([1, 2, 3], GenerationSettings(max_tokens=6), np.random.default_rng(0),
                         policy))
    assert policy.drafted[0] == 2  # 5 proposed, the 3-token batch verified
