"""specchat bench --verify-costs: the cost curve measured the way the engine verifies."""

from __future__ import annotations

import io

import pytest

from chatapp.backends.fake import FakeBackend
from chatapp.bench.verify_costs import (
    VerifyCost,
    full_acceptance_ceiling,
    measure_verify_costs,
    print_verify_costs,
)


class SteppedBackend(FakeBackend):
    """A fake target whose evaluation of n tokens is recorded with the logits asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[int, int, int]] = []  # (cached before, tokens fed, logits)

    def evaluate(self, tokens, n_logits):
        self.asked.append((len(self.cached_tokens), len(tokens), n_logits))
        return super().evaluate(tokens, n_logits)


def test_each_size_is_fed_after_the_context_with_logits_at_every_position() -> None:
    target = SteppedBackend()
    context = [1, 2, 3, 4, 5]
    costs = measure_verify_costs(target, context, [6, 7, 8, 9], [1, 2, 4], repeats=3)
    assert [c.tokens for c in costs] == [1, 2, 4]
    assert all(c.seconds >= 0.0 for c in costs)
    timed = target.asked[1:]  # the first call evaluates the context
    assert timed == [(5, n, n) for n in (1, 2, 4) for _ in range(3)]
    assert list(target.cached_tokens) == context  # truncated back after every timing


def test_too_few_tokens_to_feed_is_refused() -> None:
    with pytest.raises(ValueError):
        measure_verify_costs(FakeBackend(), [1, 2], [3], [1, 2])


def test_table_relates_each_size_to_one_token() -> None:
    out = io.StringIO()
    print_verify_costs(out, [VerifyCost(1, 0.030), VerifyCost(16, 0.240)])
    lines = out.getvalue().splitlines()
    assert lines[1].split() == ["1", "30.0", "1.00", "30.0", "1.00x"]
    assert lines[2].split() == ["16", "240.0", "8.00", "15.0", "2.00x"]


def test_the_ceiling_is_the_size_with_most_tokens_per_one_token_time() -> None:
    out = io.StringIO()
    costs = [VerifyCost(1, 0.030), VerifyCost(16, 0.240), VerifyCost(17, 0.300),
             VerifyCost(32, 0.400)]
    print_verify_costs(out, costs)
    assert full_acceptance_ceiling(costs) == (32, pytest.approx(2.4))
    assert out.getvalue().splitlines()[-2:] == [
        "Even with every draft token accepted, no step beats 2.40x plain decoding here "
        "(n = 32, of the sizes timed).",
        # n = 1 only: 16 does not follow
        "For python -m benchmarks.drafter_replay: --costs 30.0"]
    assert full_acceptance_ceiling([VerifyCost(16, 0.240)]) is None
