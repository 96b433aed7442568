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


class ThreadChoice(Protocol):
    @property
    def current(self) -> int:
        """The thread count most evaluations use now."""
        ...

    def choose(self, n_tokens: int) -> int:
        """The thread count for the next evaluation of ``n_tokens`` tokens."""
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

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        pass


def make_thread_choice(threads: int | None, cores: int, adaptive: bool = True) -> ThreadChoice:
    """``threads`` fixed when given; else all ``cores``, adapting to a busy machine when
    ``adaptive`` (False where timing the CPU says nothing, e.g. work on a GPU)."""
    if threads:
        return FixedThreads(threads)
    return AdaptiveThreads(cores) if adaptive else FixedThreads(cores)


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
    """Learns the fastest thread count on ``cores`` cores; starts on all of them."""

    def __init__(self, cores: int) -> None:
        if cores < 1:
            raise ValueError(f"cores must be >= 1, got {cores}")
        self._counts = candidate_counts(cores)
        self._current = self._counts[0]
        self._average: dict[tuple[int, int], float] = {}
        self._usual: dict[int, float] = {}  # per bucket, the current count's long-run average
        self._interval = _FIRST_INTERVAL
        self._until_try = _FIRST_INTERVAL
        self._trying: int | None = None
        self._try_wins = 0
        self._next_direction = -1  # which neighbour the next try takes: fewer (-1) or more (+1)

    @property
    def current(self) -> int:
        return self._current

    def choose(self, n_tokens: int) -> int:
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
        if threads == self._trying and (self._current, bucket) in self._average:
            self._judge_try(bucket, cost)
            return
        if threads != self._current:
            return
        self._until_try -= 1
        self._remember(threads, bucket, cost)
        average = self._average[threads, bucket]
        usual = self._usual.get(bucket)
        if usual is not None and average > _SLOWDOWN * usual:
            self._until_try = min(self._until_try, 1)  # got slower: another count may win now
            self._usual[bucket] = average  # once per slowdown
        else:
            self._usual[bucket] = cost if usual is None else usual + _SLOW_ALPHA * (cost - usual)

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
