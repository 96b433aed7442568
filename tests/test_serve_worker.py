"""The server's engine worker (``chatapp.serve.worker``): one job at a time, and a job counts
as running until the models' thread has ended its turn."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from chatapp.serve.worker import Closing, EngineWorker


def test_turn_over_waits_for_the_models_thread_to_end_the_job() -> None:
    """The job's last item comes before its thread is done (an exchange saves its reply, a
    generator closes): a handler that waits for ``turn_over`` answers only once the worker is
    free, so a client never reads its reply while the engine still counts as busy."""

    def produce(cancel: threading.Event) -> Iterator[str]:
        yield "reply"
        time.sleep(0.3)  # the thread's turn goes on after the last item

    async def handle() -> tuple[list[str], bool, bool]:
        worker = EngineWorker(max_waiting=1)
        async with worker.job(produce) as stream:
            items = await stream.next()
            busy_after_last_item = worker.busy
            await stream.turn_over()
            busy_after_turn = worker.busy
        await worker.close()
        return items, busy_after_last_item, busy_after_turn

    items, busy_after_last_item, busy_after_turn = asyncio.run(handle())
    assert items == ["reply"]
    assert busy_after_last_item  # the window the handlers must not answer in
    assert not busy_after_turn


def test_a_failed_job_reaches_its_handler_once_the_worker_is_free() -> None:
    """A refusal raised on the models' thread (a prompt too long) reaches the handler only once
    the worker is free: the next request, answered after it, is never refused as busy."""

    def produce(cancel: threading.Event) -> Iterator[str]:
        raise ValueError("refused")
        yield "never"

    async def handle() -> bool:
        worker = EngineWorker(max_waiting=0)
        try:
            async with worker.job(produce) as stream:
                await stream.next()
        except ValueError:
            busy = worker.busy
        await worker.close()
        return busy

    assert asyncio.run(handle()) is False



def test_a_waiter_whose_turn_came_as_the_server_closed_never_runs_on_freed_models() -> None:
    """Issue 35, item 8: the running job ends and hands its turn to a waiting request; before
    that request resumes, the server's close begins and frees the models. The waiter must get
    ``Closing``; its job must never run on freed models.

    The order is made deterministic on the event loop: the first job's thread, as it ends,
    schedules (two hops later, so after the job's end is processed and before the waiter
    resumes) the start of ``close``."""
    freed = threading.Event()
    ran_after_free: list[bool] = []
    closing: list[asyncio.Task[None]] = []

    async def run() -> str:
        loop = asyncio.get_running_loop()
        worker = EngineWorker(max_waiting=1)

        def start_close() -> None:
            closing.append(loop.create_task(worker.close(freed.set)))

        def first(cancel: threading.Event) -> Iterator[str]:
            yield "first"
            time.sleep(0.2)  # the waiter queues meanwhile
            loop.call_soon_threadsafe(loop.call_soon, start_close)

        def second(cancel: threading.Event) -> Iterator[str]:
            ran_after_free.append(freed.is_set())
            yield "second"

        async def waiter() -> str:
            try:
                async with worker.job(second) as stream:
                    await stream.next()
            except Closing:
                return "closing"
            return "ran"

        async with worker.job(first) as stream:
            await stream.next()
            waiting = asyncio.ensure_future(waiter())
            while worker.waiting == 0:
                await asyncio.sleep(0)
            await stream.turn_over()
        outcome = await waiting
        await closing[0]
        return outcome

    assert asyncio.run(run()) == "closing"
    assert ran_after_free == []
