"""One generation at a time, on one thread, with a bounded queue before it.

The models run on the worker's single thread (loading, every exchange, closing): llama.cpp and
SQLite stay on the thread that opened them. ``job`` admits a request: at once when the worker is
idle, else into a first-in-first-out queue of at most ``max_waiting`` requests (one more is
refused with ``QueueFull``, which says when to retry). A job's items (the exchange's events) cross
to the event loop as they come; leaving the ``job`` block for any reason (the reply is done, the
client went away, the handler failed) sets the job's cancel event, so the engine stops after the
step under way, and the next request starts as soon as the thread is free.

``close`` (Ctrl+C, SIGTERM) refuses new jobs, answers every waiting one with ``Closing``, cancels
the running one after its step and waits for it.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_END = object()
RECENT_JOBS = 8  # how many job durations the retry estimate averages


class QueueFull(Exception):
    """Every place in the queue is taken; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"retry after {retry_after} s")
        self.retry_after = retry_after


class Closing(Exception):
    """The server is stopping: no new generation."""


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class JobStream(Generic[T]):
    """The items of one job, on the event loop's side."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False
        self.turn: asyncio.Future[Any] | None = None  # the job on the models' thread

    async def turn_over(self) -> None:
        """Wait until the models' thread has ended this job's turn: from then on the worker is
        free (or the next request's). A handler calls it after the job's last item and before
        it answers, so that a client never sees its reply while the engine still counts as
        busy."""
        if self.turn is not None:
            await asyncio.shield(self.turn)

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    async def next(self) -> list[T]:
        """The items that came since the last call (waits for at least one); [] once the job is
        over. Raises what the job raised."""
        items: list[Any] = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        out: list[T] = []
        for item in items:
            if item is _END:
                self.finished = True
            elif isinstance(item, _Failed):
                self.finished = True
                raise item.error
            else:
                out.append(item)
        return out


class EngineWorker:
    """See the module docstring."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="specchat-engine")
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._busy = False
        self._closing = False
        self._cancel: threading.Event | None = None
        self._running: asyncio.Future[Any] | None = None
        self._durations: deque[float] = deque(maxlen=RECENT_JOBS)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> bool:
        return self._busy

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` on the models' thread (loading and closing them)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    @asynccontextmanager
    async def job(self, produce: Callable[[threading.Event], Iterator[T]]
                  ) -> AsyncIterator[JobStream[T]]:
        """Run ``produce(cancel)`` on the models' thread once it is this request's turn; the
        block reads its items from the stream. Raises ``QueueFull`` or ``Closing`` (also when
        the turn came as the server began to stop: the models may be closed already). The end of
        the job, or its error, reaches the stream only once the models' thread is free."""
        await self._acquire()
        if self._closing:
            self._release(None)
            raise Closing()
        loop = asyncio.get_running_loop()
        stream: JobStream[T] = JobStream()
        cancel = threading.Event()
        self._cancel = cancel
        started = loop.time()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(stream.put, item)

        running = loop.run_in_executor(self._executor, _drive, produce, cancel, put)
        self._running = stream.turn = running

        def ended(turn: asyncio.Future[BaseException | None]) -> None:
            self._release(loop.time() - started)
            error = None if turn.cancelled() else (turn.exception() or turn.result())
            stream.put(_END if error is None else _Failed(error))

        running.add_done_callback(ended)
        try:
            yield stream
        finally:
            cancel.set()

    async def _acquire(self) -> None:
        if self._closing:
            raise Closing()
        if not self._busy:
            self._busy = True
            return
        if len(self._waiters) >= self.max_waiting:
            raise QueueFull(self.retry_after())
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn in self._waiters:
                self._waiters.remove(turn)
            elif turn.done() and not turn.cancelled() and turn.exception() is None:
                self._release(None)  # it was our turn, and we left: pass it on
            raise

    def _release(self, seconds: float | None) -> None:
        """The job is over (``seconds`` long): the next waiting request's turn, if any."""
        if seconds is not None:
            self._durations.append(seconds)
            self._cancel = None
            self._running = None
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._busy = False

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: the recent jobs' mean duration
        times the jobs ahead (at least 1)."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, math.ceil(mean * (len(self._waiters) + 1)))

    async def close(self, finish: Callable[[], None] | None = None) -> None:
        """Stop: waiting requests get ``Closing``, the running job stops after its step; then
        ``finish`` runs on the models' thread (closing the models) and the thread ends."""
        self._closing = True
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_exception(Closing())
        if self._cancel is not None:
            self._cancel.set()
        if self._running is not None:
            await asyncio.wait([self._running])
        if finish is not None:
            await self.call(finish)
        self._executor.shutdown(wait=True)

    def stop_running(self) -> None:
        """Cancel the running job (it stops after its step)."""
        if self._cancel is not None:
            self._cancel.set()


def _drive(produce: Callable[[threading.Event], Iterator[Any]], cancel: threading.Event,
           put: Callable[[Any], None]) -> BaseException | None:
    """(The models' thread.) Put every item of ``produce(cancel)``; the error it raised, if
    any (the job's end is put on the event loop once the thread is free)."""
    try:
        for item in produce(cancel):
            put(item)
    except BaseException as error:  # noqa: BLE001 (handed to the request's handler)
        return error
    return None
