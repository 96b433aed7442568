"""VerifyCostModel: the cost of verifying n tokens, learnt per n as measured (the draft policy's
yardstick), on timings of real machines."""

from __future__ import annotations

import pytest

from chatapp.policy.verify_cost import VerifyCostModel


def test_one_slow_step_does_not_swing_the_verify_cost() -> None:
    model = VerifyCostModel(9)
    for _ in range(20):
        model.observe(1, 0.046)
    model.observe(1, 5.0)  # the machine was busy
    assert model.predict(1) < 0.046 * 2.1


def test_verify_cost_extrapolates_from_few_observations() -> None:
    model = VerifyCostModel(9)
    assert model.predict(1) is None
    for _ in range(10):
        model.observe(1, 0.046)
        model.observe(4, 0.121)
    predicted = [model.predict(n) for n in range(1, 10)]
    assert predicted == sorted(predicted)
    assert predicted[0] == pytest.approx(0.046, rel=0.05)
    assert predicted[3] == pytest.approx(0.121, rel=0.05)
    assert predicted[5] == pytest.approx(0.144, rel=0.15)  # the measured 6-token cost


# ms to evaluate n tokens on issue 12's 2-core Xeon (llama-bench ppN): 4 tokens cost less than 3
SAWTOOTH = {1: .065, 2: .089, 3: .101, 4: .086, 5: .112, 6: .128, 8: .183}


def test_verify_cost_keeps_what_each_measured_n_costs() -> None:
    model = VerifyCostModel(9)
    for _ in range(5):
        for n, seconds in SAWTOOTH.items():
            model.observe(n, seconds)
    for n, seconds in SAWTOOTH.items():
        assert model.predict(n) == pytest.approx(seconds, rel=1e-6)
    assert model.predict(4) < model.predict(3)


def test_verify_cost_of_an_n_never_measured_errs_cheap() -> None:
    # Linear in n (each fed token costs the same): between two measured n, linear; beyond, the
    # a + b ln(n) curve through them, below the line: the policy tries such an n and learns.
    model = VerifyCostModel(9)
    for _ in range(5):
        model.observe(1, 0.046)
        model.observe(4, 0.184)
    assert model.predict(2) == pytest.approx(0.092, rel=1e-6)
    assert 0.184 < model.predict(8) < 0.046 * 8
    assert not model.measured(8)
    model.observe(8, 0.368)
    assert model.measured(8) and model.predict(8) == pytest.approx(0.368)


def test_one_slow_first_timing_of_an_n_is_clipped() -> None:
    model = VerifyCostModel(9)
    for _ in range(5):
        model.observe(1, 0.065)
        model.observe(4, 0.086)
    expected = model.predict(3)
    model.observe(3, 0.400)  # the first timing of 3 tokens, on a busy machine
    assert model.predict(3) <= 1.5 * expected


def test_a_cost_measured_dear_long_ago_is_tried_again() -> None:
    # Timed once, cold (a first call); then only plain steps for a long while: 4 tokens count as
    # unmeasured again, predicted from what is known, so the policy tries them again.
    model = VerifyCostModel(9)
    model.observe(4, 0.300)
    for _ in range(300):
        model.observe(1, 0.065)
    assert not model.measured(4)
    assert model.predict(4) < 0.300 / 2


def test_an_exploring_guess_is_the_cost_below_only_where_it_could_pay() -> None:
    # Measured 10 and 17 tokens: an exploring guess for 16 is the cost of 10 (the interpolation
    # would never get it tried); not before 17 is established, nor on flat costs, nor for an n
    # measured before.
    model = VerifyCostModel(17)
    model.observe(10, 0.238)
    model.observe(17, 0.285)
    assert model.predict(16, explore=True) == model.predict(16) > 0.27
    for _ in range(3):
        model.observe(10, 0.238)
        model.observe(17, 0.285)
    assert model.predict(16, explore=True) == pytest.approx(0.238)
    assert model.predict(16) > 0.27
    model.observe(16, 0.238)
    model.observe(15, 0.297)
    assert model.predict(15, explore=True) == pytest.approx(0.297)
    flat = VerifyCostModel(17)
    for _ in range(4):
        flat.observe(1, 0.020)
        flat.observe(17, 0.0203)
    assert flat.predict(8, explore=True) == flat.predict(8)
