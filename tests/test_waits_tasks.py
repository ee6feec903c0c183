"""The asyncio twin's waits (novaque._waits.TASKS): threading's Event and Condition
methods for tasks, as the consumer's loops use them through the bridge."""

from __future__ import annotations

import asyncio
import threading

import pytest

from novaque._bridge import bridged
from novaque._waits import TASKS


def test_an_event_wakes_its_waiters_from_the_loop_or_another_thread_and_times_out() -> None:
    async def main() -> None:
        event = TASKS.event()
        assert await bridged(event.wait, 0.01) is False  # nobody set it: the timeout
        assert await bridged(event.wait, 0) is False
        waiters = [asyncio.ensure_future(bridged(event.wait, 30)) for _ in range(3)]
        await asyncio.sleep(0)
        threading.Thread(target=event.set).start()  # a wake-up from another thread
        assert await asyncio.gather(*waiters) == [True, True, True]
        assert event.is_set()
        assert await bridged(event.wait, 30) is True
        event.clear()
        assert not event.is_set()
        waiting = asyncio.ensure_future(bridged(event.wait, None))
        await asyncio.sleep(0)
        event.set()  # from the loop itself
        assert await waiting is True

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_condition_wakes_as_many_as_notified_and_times_out() -> None:
    async def main() -> None:
        lock = threading.Lock()
        condition = TASKS.condition(lock)

        def wait(timeout: float) -> bool:
            with lock:
                woken = condition.wait(timeout)
                assert lock.locked()  # held again on return, as threading's
                return woken

        def notify(n: int) -> None:
            with lock:
                condition.notify(n)

        assert await bridged(wait, 0.01) is False
        waiters = [asyncio.ensure_future(bridged(wait, 0.5)) for _ in range(3)]
        await asyncio.sleep(0)
        await bridged(notify, 2)
        assert sorted(await asyncio.gather(*waiters)) == [False, True, True]

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    async def main() -> None:
        event = TASKS.event()
        waiting = asyncio.ensure_future(bridged(event.wait, 30))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert event._waiters == []  # type: ignore[attr-defined]
        event.set()
        assert await bridged(event.wait, 1) is True

    asyncio.run(asyncio.wait_for(main(), 10))
