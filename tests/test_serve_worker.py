"""The server's engine worker (``chatapp.serve.worker``): one job at a time, and a job counts
as running until the models' thread has ended its turn."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from chatapp.serve.worker import EngineWorker


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

