"""The adaptive thread count, driven by simulated machines (fixed seeds): it must reach at least
0.9x the best fixed count under contention, 0.97x of all cores when idle, and follow changes."""

from __future__ import annotations

import numpy as np
import pytest

from chatapp.backends.threads import (
    AdaptiveThreads,
    FixedThreads,
    candidate_counts,
    first_count,
    make_thread_choice,
)


def two_cores(threads: int, busy: bool) -> float:
    """Seconds per one-token evaluation on 2 cores, from the issue's measurements: idle 15.9 tok/s
    on 2 threads; with one CPU-bound process beside it 2.05 tok/s on 2 threads, 8.8 on 1."""
    if busy:
        return {2: 1 / 2.05, 1: 1 / 8.8}[threads]
    return {2: 1 / 15.9, 1: 1 / 9.0}[threads]


def eight_cores(threads: int, busy: bool) -> float:
    """8 cores, one of them taken by another process when busy: 7 threads are best then."""
    ideal = 0.5 / threads + 0.02
    if busy and threads == 8:
        return 4 * ideal  # one thread keeps waiting for the core it does not get
    return ideal


def this_vm(threads: int, busy: bool) -> float:
    """Measured on a 2-core AMD EPYC VM beside other jobs: 2 threads 7x slower than 1."""
    return {2: 1 / 2.2, 1: 1 / 16.0}[threads] if busy else {2: 1 / 15.0, 1: 1 / 14.0}[threads]


def simulate(choice, cost, phases, seed: int, sizes=(1,), noise: float = 0.08
             ) -> tuple[float, list[float]]:
    """Run evaluations through ``choice``; returns total seconds and seconds per phase."""
    rng = np.random.default_rng(seed)
    per_phase = []
    for busy, steps in phases:
        spent = 0.0
        for step in range(steps):
            for n in choice.chunks(sizes[step % len(sizes)]):
                threads = choice.choose(n)
                seconds = cost(threads, busy) * (1 + 0.15 * (n - 1)) * rng.lognormal(0, noise)
                choice.observe(threads, n, seconds)
                spent += seconds
        per_phase.append(spent)
    return sum(per_phase), per_phase


def best_fixed(cost, phases, counts, seed: int, sizes=(1,), noise: float = 0.08) -> list[float]:
    """Per phase, the time of the best fixed count in hindsight."""
    results = [simulate(FixedThreads(t), cost, phases, seed, sizes, noise)[1] for t in counts]
    return [min(r[i] for r in results) for i in range(len(phases))]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sizes", [(1,), (1, 4, 1, 3)])
def test_two_cores_busy_reaches_the_best_fixed_count(seed: int, sizes) -> None:
    phases = [(True, 1500)]
    _, adaptive = simulate(AdaptiveThreads(2), two_cores, phases, seed, sizes)
    best = best_fixed(two_cores, phases, [1, 2], seed, sizes)
    assert best[0] / adaptive[0] >= 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_cores_idle_keeps_all_cores(seed: int) -> None:
    phases = [(False, 1500)]
    _, adaptive = simulate(AdaptiveThreads(2), two_cores, phases, seed)
    _, all_cores = simulate(FixedThreads(2), two_cores, phases, seed)
    assert all_cores[0] / adaptive[0] >= 0.97


@pytest.mark.parametrize("seed", [0, 1])
def test_follows_contention_starting_and_ending(seed: int) -> None:
    phases = [(False, 600), (True, 1500), (False, 3000)]
    tuner = AdaptiveThreads(2)
    _, adaptive = simulate(tuner, two_cores, phases, seed)
    best = best_fixed(two_cores, phases, [1, 2], seed)
    ratios = [b / a for b, a in zip(best, adaptive)]
    assert all(r >= floor for r, floor in zip(ratios, [0.97, 0.9, 0.9])), ratios
    assert tuner.current == 2  # back on every core once the machine is idle again


def test_eight_cores_with_one_taken_settles_on_seven() -> None:
    phases = [(True, 2000)]
    tuner = AdaptiveThreads(8)
    _, adaptive = simulate(tuner, eight_cores, phases, 0)
    best = best_fixed(eight_cores, phases, candidate_counts(8), 0)
    assert best[0] / adaptive[0] >= 0.9
    assert tuner.current == 7


def test_a_fixed_count_is_obeyed() -> None:
    fixed = FixedThreads(2)
    simulate(fixed, two_cores, [(True, 200)], 0)
    assert fixed.current == 2 and fixed.choose(1) == 2


def test_one_core_never_tries_another_count() -> None:
    tuner = AdaptiveThreads(1)
    for _ in range(100):
        assert tuner.choose(1) == 1
        tuner.observe(1, 1, 0.1)


def test_candidates() -> None:
    assert candidate_counts(1) == [1]
    assert candidate_counts(2) == [2, 1]
    assert candidate_counts(8) == [8, 7, 4, 2, 1]


def test_a_size_first_seen_during_a_try_is_run_on_the_current_count() -> None:
    """A try on one-token evaluations must not be judged on a size never measured before."""
    tuner = AdaptiveThreads(2)
    for _ in range(20):
        tuner.observe(tuner.choose(1), 1, 0.05)
    sizes = [1, 2, 2, 1, 3, 1]  # 2 and 3 are new when they come
    for n in sizes:
        threads = tuner.choose(n)
        if n in (2, 3) and n not in sizes[:sizes.index(n)]:
            assert threads == tuner.current
        tuner.observe(threads, n, 0.05 * n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_contention_where_the_other_count_is_very_costly(seed: int) -> None:
    """Times scattered by 30% and a neighbour 7x slower: tries must stay rare, not re-fire on
    noise."""
    phases = [(True, 400), (True, 1600)]
    _, adaptive = simulate(AdaptiveThreads(2), this_vm, phases, seed, noise=0.3)
    best = best_fixed(this_vm, phases, [1, 2], seed, noise=0.3)
    assert best[1] / adaptive[1] >= 0.9  # once it has settled
    assert sum(best) / sum(adaptive) >= 0.85  # finding it included


def test_the_factory_fixes_a_given_count_and_adapts_otherwise() -> None:
    from chatapp.backends.threads import make_thread_choice

    assert isinstance(make_thread_choice(3, 8), FixedThreads)
    assert make_thread_choice(3, 8).current == 3
    assert isinstance(make_thread_choice(None, 8), AdaptiveThreads)
    fixed = make_thread_choice(None, 8, adaptive=False)
    assert isinstance(fixed, FixedThreads) and fixed.current == 8


# -- a fresh start on a machine that is already busy ------------------------------------------

REPLY = (150,) + (1,) * 64  # a fresh start's reply: the prompt in one evaluation, then 64 tokens


def reply_time(choice, busy: bool, seed: int) -> float:
    return simulate(choice, two_cores, [(busy, len(REPLY))], seed, REPLY)[0]


def best_fixed_reply(busy: bool, seed: int) -> float:
    return min(reply_time(FixedThreads(t), busy, seed) for t in (1, 2))


@pytest.mark.parametrize("cores, others_busy, expected", [
    (2, None, 2), (2, 0.05, 2), (2, 0.4, 2), (2, 0.9, 1), (2, 1.0, 1), (2, 2.5, 1),
    (8, 1.0, 7), (8, 3.2, 4), (1, 0.0, 1),
])
def test_the_first_count_leaves_the_busy_cores_alone(cores, others_busy, expected) -> None:
    assert first_count(cores, others_busy) == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_busy_before_the_start_and_seen_while_loading(seed: int) -> None:
    tuner = make_thread_choice(None, 2, others_busy=1.0)
    assert tuner.current == 1
    assert best_fixed_reply(True, seed) / reply_time(tuner, True, seed) >= 0.9


def learnt_on_an_idle_machine(seed: int) -> dict[str, float]:
    tuner = AdaptiveThreads(2)
    simulate(tuner, two_cores, [(False, 400)], seed, REPLY)
    return tuner.learnt()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_busy_before_the_start_unseen_while_loading_but_remembered(seed: int) -> None:
    """The load saw nothing (the other process started right after it), but the prompt's
    evaluation costs far more than it did before: the next token is a try, judged at once."""
    memory = learnt_on_an_idle_machine(seed)
    assert {"2/1", "2/8", "2/17"} <= set(memory)  # the counts it ran on, the head included
    tuner = make_thread_choice(None, 2, others_busy=0.0, expected=memory)
    assert tuner.current == 2
    assert best_fixed_reply(True, seed) / reply_time(tuner, True, seed) >= 0.9
    assert tuner.current == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_busy_before_the_start_with_nothing_known_tries_early(seed: int) -> None:
    tuner = make_thread_choice(None, 2, others_busy=None)
    assert best_fixed_reply(True, seed) / reply_time(tuner, True, seed) >= 0.8
    assert tuner.current == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_idle_with_a_memory_is_no_slower_than_all_cores(seed: int) -> None:
    tuner = make_thread_choice(None, 2, others_busy=0.0, expected=learnt_on_an_idle_machine(seed))
    phases = [(False, 1500)]
    _, adaptive = simulate(tuner, two_cores, phases, seed)
    _, all_cores = simulate(FixedThreads(2), two_cores, phases, seed)
    assert all_cores[0] / adaptive[0] >= 0.97


def test_a_remembered_cost_that_does_not_parse_is_left_out() -> None:
    tuner = AdaptiveThreads(2, expected={"2/1": 0.05, "x/1": 1.0, "1/1": "slow", "1/2": -1.0})
    assert tuner._expected == {(2, 1): 0.05}


def test_the_memory_keeps_the_quiet_machines_costs(tmp_path) -> None:
    from chatapp.backends import thread_memory

    path = tmp_path / "threads" / "model.json"
    assert thread_memory.recall(path) == {}
    thread_memory.remember({"2/1": 0.06, "1/1": 0.11}, path)
    thread_memory.remember({"2/1": 0.45, "1/1": 0.10}, path)  # a busy run: 2 threads dearer
    assert thread_memory.recall(path) == {"2/1": 0.06, "1/1": 0.10}
    path.write_text("[not a dict")
    assert thread_memory.recall(path) == {}
