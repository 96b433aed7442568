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
  ``_MAX_INTERVAL`` evaluations), so an idle machine pays almost nothing for the watching.
- An evaluation ``_SLOWDOWN`` times slower than the best average seen for its size (another
  process started) brings the next try forward, so contention is answered within a few tokens.

``FixedThreads`` is the user's own ``threads`` setting, obeyed as it is.
"""

from __future__ import annotations

import os
from typing import Protocol

_SMALL = 16  # evaluations of up to this many tokens have their own bucket; larger ones share one
_ALPHA = 0.3  # weight of a new time in the moving average
_BETTER = 0.92  # a try must take at most this share of the current count's time
_SLOWDOWN = 1.4  # an evaluation this much slower than its best average starts a try soon
_FIRST_INTERVAL = 8  # evaluations between tries after a change
_MAX_INTERVAL = 256  # the longest wait between tries (costs < 1% idle, see the module notes)


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
        self._best: dict[int, float] = {}  # per bucket, for the current count
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
        best = self._best.get(bucket)
        if best is not None and cost > _SLOWDOWN * best:
            self._until_try = min(self._until_try, 1)
        self._best[bucket] = cost if best is None else min(best, self._average[threads, bucket])

    def _judge_try(self, bucket: int, cost: float) -> None:
        reference = self._average[self._current, bucket]
        trying = self._trying
        assert trying is not None
        self._remember(trying, bucket, cost)
        if cost > _BETTER * reference:
            self._end_try(adopted=False)
        elif self._try_wins == 0:
            self._try_wins = 1  # one more, to be sure it was not luck
        else:
            self._current = trying
            self._best = {}
            self._end_try(adopted=True)

    def _end_try(self, adopted: bool) -> None:
        self._trying = None
        self._try_wins = 0
        self._interval = _FIRST_INTERVAL if adopted else min(2 * self._interval, _MAX_INTERVAL)
        self._until_try = self._interval
        if not adopted:
            self._next_direction = -self._next_direction

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
