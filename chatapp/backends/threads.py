"""How many CPU threads a model's next evaluation should use, learnt from measured times.

On an idle machine every core helps; when another process keeps a core busy, threads that wait
for each other at every barrier make decoding several times slower than fewer threads would
(measured on 2 cores with one CPU-bound process beside it: 2.05 tok/s on 2 threads, 8.8 on 1).
The best count depends on the machine and on what else runs, so ``AdaptiveThreads`` measures it:

- It runs the chosen count (``current``) and keeps, per evaluation size (1..``_SMALL`` tokens; one
  bucket for larger batches, per token), a moving average of the seconds an evaluation took.
- Now and then it tries a neighbouring count (one fewer, or one more) on one small evaluation.
  A try that is ``_BETTER`` faster than the current average is confirmed by a second one and
  then adopted; a try that loses ends at once, and the next try waits twice as long (up to
  ``_BACKOFF_LIMIT``), and long enough that lost tries cost at most ``_TRY_SHARE`` of the time
  (a try 10x slower than the current count waits 900 evaluations; at most ``_MAX_INTERVAL``).
- When the current count's average becomes ``_SLOWDOWN`` times its long-run average for a size
  (another process started: on 2 cores that costs 2 threads 4-7x), the next try comes at once,
  so contention is answered within a few tokens; noise (30% here) never gets that far.

A machine that is busy before specchat starts must not cost the first tokens, nor the prompt:

- The first count is the cores other processes leave free (``first_count``, from
  ``chatapp.backends.machine_load`` measured while the model loaded), all of them when unknown.
- What each count cost on this machine in earlier runs (``learnt``, kept by
  ``chatapp.backends.thread_memory``) is the expectation: an evaluation ``_FAR_OFF`` times dearer
  than expected (the machine got busy after the load) starts a try at once, once per size and
  start.
- The start's first large evaluation (a prompt) is checked: ``chunks`` splits off its first
  ``_HEAD`` tokens; when they cost far more than expected, or nothing at all is known of the
  machine now, the next ``_HEAD`` tokens go to the neighbouring count, and the faster of the two
  evaluates the rest.

``FixedThreads`` is the user's own ``threads`` setting, obeyed as it is.
"""

from __future__ import annotations

import math
import os
from typing import Protocol

_SMALL = 16  # evaluations of up to this many tokens have their own bucket; larger ones share one
_ALPHA = 0.3  # weight of a new time in the moving average
_SLOW_ALPHA = 0.02  # the same for the long-run average that slowdowns are measured against
_BETTER = 0.92  # a try must take at most this share of the current count's time
_SLOWDOWN = 2.0  # the average this much above its long-run value starts a try at once
_FIRST_INTERVAL = 8  # evaluations between tries after a change
_BACKOFF_LIMIT = 256  # lost tries double the wait up to this many evaluations ...
_MAX_INTERVAL = 1024  # ... and costly ones make it longer, up to this
_TRY_SHARE = 0.01  # what lost tries may cost, as a share of the evaluations between them
_FAR_OFF = 1.6  # an evaluation this much dearer than the remembered cost starts a try at once
_FIRST_TRY_AFTER = 2  # evaluations before the first try when nothing is known
_HEAD = 8  # tokens of the start's first large evaluation that check the count (and a neighbour)


class ThreadChoice(Protocol):
    @property
    def current(self) -> int:
        """The thread count most evaluations use now."""
        ...

    def choose(self, n_tokens: int) -> int:
        """The thread count for the next evaluation of ``n_tokens`` tokens."""
        ...

    def chunks(self, n_tokens: int) -> list[int]:
        """How to split an evaluation of ``n_tokens`` tokens (sizes in order, summing to it)."""
        ...

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        """That evaluation took ``seconds`` with ``threads`` threads."""
        ...


class FixedThreads:
    """Always the same count (the user's ``threads`` setting)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._threads = threads

    @property
    def current(self) -> int:
        return self._threads

    def choose(self, n_tokens: int) -> int:
        return self._threads

    def chunks(self, n_tokens: int) -> list[int]:
        return [n_tokens]

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        pass


def make_thread_choice(threads: int | None, cores: int, adaptive: bool = True,
                       others_busy: float | None = None,
                       expected: dict[str, float] | None = None) -> ThreadChoice:
    """``threads`` fixed when given; else all ``cores``, adapting to a busy machine when
    ``adaptive`` (False where timing the CPU says nothing, e.g. work on a GPU), starting on the
    cores that ``others_busy`` cores of other work leave free, with the costs ``expected`` from
    an earlier run (``AdaptiveThreads.learnt``)."""
    if threads:
        return FixedThreads(threads)
    if not adaptive:
        return FixedThreads(cores)
    return AdaptiveThreads(cores, first_count(cores, others_busy), expected,
                           load_known=others_busy is not None)


def first_count(cores: int, others_busy: float | None) -> int:
    """The candidate count closest below the cores that ``others_busy`` cores of other work
    leave free (at least 1); all ``cores`` when nothing is known."""
    if others_busy is None:
        return cores
    free = math.floor(cores - others_busy + 0.5)
    return max([count for count in candidate_counts(cores) if count <= free], default=1)


def available_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def candidate_counts(cores: int) -> list[int]:
    """The counts worth trying on ``cores`` cores, largest first: all, all but one, then halves."""
    counts = {cores, max(1, cores - 1)}
    half = cores // 2
    while half >= 1:
        counts.add(half)
        half //= 2
    return sorted(counts, reverse=True)


class AdaptiveThreads:
    """Learns the fastest thread count on ``cores`` cores; starts on ``start`` (default: all),
    with the costs ``expected`` per count and size from an earlier run (``learnt``);
    ``load_known``: ``start`` was chosen from the machine's measured load."""

    def __init__(self, cores: int, start: int | None = None,
                 expected: dict[str, float] | None = None, load_known: bool = False) -> None:
        if cores < 1:
            raise ValueError(f"cores must be >= 1, got {cores}")
        self._counts = candidate_counts(cores)
        self._current = start if start in self._counts else self._counts[0]
        self._average: dict[tuple[int, int], float] = {}
        self._usual: dict[int, float] = {}  # per bucket, the current count's long-run average
        self._typical: dict[tuple[int, int], float] = {}  # every count's, for ``learnt``
        self._expected = _parse_costs(expected or {})
        self._load_known = load_known
        self._interval = _FIRST_INTERVAL
        knows_something = bool(self._expected) or load_known
        self._until_try = _FIRST_INTERVAL if knows_something else _FIRST_TRY_AFTER
        self._checking_start = len(self._counts) > 1 and (bool(self._expected) or not load_known)
        self._head_cost: float | None = None  # the start's head, on the current count
        self._trying: int | None = None
        self._try_wins = 0
        self._next_direction = -1  # which neighbour the next try takes: fewer (-1) or more (+1)

    def learnt(self) -> dict[str, float]:
        """The long-run cost of each count and size measured here ("threads/bucket": seconds,
        per token for the large bucket), plain JSON data for a later ``expected``."""
        return {f"{threads}/{bucket}": cost for (threads, bucket), cost in self._typical.items()}

    @property
    def current(self) -> int:
        return self._current

    def chunks(self, n_tokens: int) -> list[int]:
        if self._checking_start and self._head_cost is None and n_tokens >= 3 * _HEAD:
            return [_HEAD, _HEAD, n_tokens - 2 * _HEAD]
        return [n_tokens]

    def choose(self, n_tokens: int) -> int:
        if self._checking_start and self._head_cost is not None:
            return self._neighbour()  # the second head: the start's check of a neighbour
        bucket = _bucket(n_tokens)
        if bucket > _SMALL or len(self._counts) == 1:
            return self._current  # tries are made on small evaluations only
        if (self._current, bucket) not in self._average:
            return self._current  # nothing to compare a try of this size with yet
        if self._trying is None and self._until_try <= 0:
            self._trying = self._neighbour()
        return self._trying if self._trying is not None else self._current

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        bucket = _bucket(n_tokens)
        cost = seconds / n_tokens if bucket > _SMALL else seconds
        if self._checking_start and self._check_start(threads, n_tokens, cost):
            return
        if threads == self._trying and (self._current, bucket) in self._average:
            self._judge_try(bucket, cost)
            return
        if threads != self._current:
            return
        self._until_try -= 1
        self._remember(threads, bucket, cost)
        typical = self._typical.get((threads, bucket))
        self._typical[threads, bucket] = cost if typical is None else (
            typical + _SLOW_ALPHA * (cost - typical))
        expected = self._expected.pop((threads, bucket), None)  # once per size and start
        if expected is not None and cost > _FAR_OFF * expected:
            self._far_off(threads, cost / expected)
        average = self._average[threads, bucket]
        usual = self._usual.get(bucket)
        if usual is not None and average > _SLOWDOWN * usual:
            self._until_try = min(self._until_try, 1)  # got slower: another count may win now
            self._usual[bucket] = average  # once per slowdown
        else:
            self._usual[bucket] = cost if usual is None else usual + _SLOW_ALPHA * (cost - usual)

    def _check_start(self, threads: int, n_tokens: int, cost: float) -> bool:
        """The start's check (see the module notes); True when it took this evaluation."""
        if self._head_cost is None:
            expected = self._expected.get((threads, _bucket(n_tokens)))
            far = expected is None and not self._load_known or (
                expected is not None and cost > _FAR_OFF * expected)
            if n_tokens == _HEAD and threads == self._current and far:
                self._head_cost = cost  # the next head goes to a neighbour
            else:
                self._checking_start = False  # not a split evaluation, or the count is as usual
            return False
        self._checking_start = False
        head, neighbour = self._head_cost, cost
        if threads != self._current and neighbour < _BETTER * head:
            self._current = threads
            self._usual = {}
        self._end_try(lost_ratio=max(head, neighbour) / max(min(head, neighbour), 1e-12))
        return True

    def _far_off(self, threads: int, ratio: float) -> None:
        """An evaluation on ``threads`` cost ``ratio`` times what was remembered: the machine is
        busy now. Every size not yet timed this run is expected that much dearer (so a try can
        be judged at once, on any size), and the next small evaluation is a try."""
        for (count, bucket), cost in list(self._expected.items()):
            if count == threads and (count, bucket) not in self._average:
                self._average[count, bucket] = ratio * cost
        self._until_try = min(self._until_try, 0)

    def _judge_try(self, bucket: int, cost: float) -> None:
        reference = self._average[self._current, bucket]
        trying = self._trying
        assert trying is not None
        self._remember(trying, bucket, cost)
        if cost > _BETTER * reference:
            self._end_try(lost_ratio=cost / reference)
        elif self._try_wins == 0:
            self._try_wins = 1  # one more, to be sure it was not luck
        else:
            self._current = trying
            self._usual = {}
            self._end_try(lost_ratio=None)

    def _end_try(self, lost_ratio: float | None) -> None:
        """After an adopted try (``lost_ratio`` None) try again soon; after a lost one wait
        twice as long, and long enough that tries as costly as this one (a ratio of 10 to the
        current count's time wastes 9 evaluations) stay under ``_TRY_SHARE`` of the time."""
        self._trying = None
        self._try_wins = 0
        if lost_ratio is None:
            self._interval = _FIRST_INTERVAL
        else:
            affordable = math.ceil((lost_ratio - 1) / _TRY_SHARE)
            self._interval = min(max(min(2 * self._interval, _BACKOFF_LIMIT), affordable),
                                 _MAX_INTERVAL)
            self._next_direction = -self._next_direction
        self._until_try = self._interval

    def _neighbour(self) -> int:
        """The count one step fewer or more than the current one (the other way at an end)."""
        index = self._counts.index(self._current)
        step = 1 if self._next_direction < 0 else -1  # the list runs from most to fewest
        if not 0 <= index + step < len(self._counts):
            step = -step
        return self._counts[index + step]

    def _remember(self, threads: int, bucket: int, cost: float) -> None:
        key = (threads, bucket)
        old = self._average.get(key)
        self._average[key] = cost if old is None else old + _ALPHA * (cost - old)


def _bucket(n_tokens: int) -> int:
    return min(n_tokens, _SMALL + 1)


def _parse_costs(data: dict[str, float]) -> dict[tuple[int, int], float]:
    """``learnt()`` data as {(threads, bucket): seconds}; entries that do not parse are left out."""
    costs = {}
    for key, value in data.items():
        try:
            threads, bucket = (int(part) for part in str(key).split("/"))
            cost = float(value)
        except (TypeError, ValueError):
            continue
        if threads >= 1 and bucket >= 1 and math.isfinite(cost) and cost > 0:
            costs[threads, bucket] = cost
    return costs
