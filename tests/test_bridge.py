"""The asyncio twin's greenlet bridge (novaque._bridge.bridged): SQLAlchemy's
``greenlet_spawn`` protocol, with greenlets kept for the next call."""

from __future__ import annotations

import asyncio
import contextvars

import greenlet
import pytest
from sqlalchemy.util import await_only

from novaque._bridge import bridged

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_results_errors_and_awaits_go_through_and_the_greenlet_is_kept() -> None:
    carriers: list[greenlet.greenlet] = []

    def work(x: int) -> int:
        carriers.append(greenlet.getcurrent())
        slept = await_only(asyncio.sleep(0, result=x))  # awaited by the caller, on the loop
        return slept * 2

    def fail() -> None:
        carriers.append(greenlet.getcurrent())
        raise KeyError("nope")

    async def main() -> None:
        assert await bridged(work, 21) == 42
        with pytest.raises(KeyError, match="nope"):
            await bridged(fail)
        assert await bridged(work, x=5) == 10

    asyncio.run(main())
    assert len(set(map(id, carriers))) == 1  # one greenlet served the three calls


def test_the_callers_context_is_the_calls() -> None:
    # contextvars (OpenTelemetry's current span, a request id) reach the sync
    # code, as with greenlet_spawn.
    seen: list[str] = []

    async def main() -> None:
        for value in ("a", "b"):
            request_id.set(value)
            await bridged(lambda: seen.append(request_id.get()))

    asyncio.run(main())
    assert seen == ["a", "b"]


def test_concurrent_calls_each_get_a_greenlet_and_nested_calls_work() -> None:
    order: list[str] = []

    def inner(name: str) -> str:
        return name.upper()

    async def nested(name: str) -> str:
        return await bridged(inner, name)

    def outer(name: str) -> str:
        order.append(f"{name} in")
        await_only(asyncio.sleep(0.01))
        got = await_only(nested(name))  # a call made while this one awaits
        order.append(f"{name} out")
        return got

    async def main() -> list[str]:
        return await asyncio.gather(*(bridged(outer, n) for n in ("a", "b", "c")))

    assert asyncio.run(main()) == ["A", "B", "C"]
    assert order[:3] == ["a in", "b in", "c in"]  # they awaited side by side


def test_a_cancelled_caller_cancels_the_call_which_may_clean_up() -> None:
    cleaned: list[str] = []

    def waits() -> None:
        try:
            await_only(asyncio.sleep(30))
        finally:
            cleaned.append("finally ran")

    async def main() -> None:
        task = asyncio.ensure_future(bridged(waits))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await bridged(lambda: 7) == 7  # the bridge serves on

    asyncio.run(asyncio.wait_for(main(), 10))
    assert cleaned == ["finally ran"]
