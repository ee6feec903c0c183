"""How the runtime runs its background work and waits: threads, or asyncio tasks.

The consumer (:mod:`novaque.consumer`) and the client's runtime
(:mod:`novaque._runtime`: maintenance, the stats flusher, the LISTEN loop) are
written once, against :class:`Waits`. :data:`THREADS` serves
:class:`novaque.Client`: each loop is a thread, a wait blocks it. :data:`TASKS`
serves :class:`novaque.aio.AsyncClient`: each loop is an asyncio task running
the very same code inside SQLAlchemy's greenlet bridge (``greenlet_spawn``),
so its statements and its waits are awaited on the event loop, and a handler
is an ``async def`` awaited by its worker task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = [
    "TASKS",
    "THREADS",
    "Event",
    "Runner",
    "Waits",
    "is_async_callable",
    "jittered",
    "running_loop",
]


class Event(Protocol):
    """What the runtime needs of an event (``threading.Event``'s methods)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Condition(Protocol):
    """A condition on a lock the caller holds (``threading.Condition``'s methods)."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def notify(self, n: int = 1) -> None: ...

    def notify_all(self) -> None: ...


class Runner(Protocol):
    """A background loop once started: a thread or a task."""

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...

    def is_current(self) -> bool:
        """True when called from this very loop (a handler shutting its consumer down)."""
        ...


class Waits(Protocol):
    """Makes the runtime's events, conditions and loops, and calls handlers."""

    def event(self) -> Event: ...

    def condition(self, lock: threading.Lock) -> Condition: ...

    def spawn(self, target: Callable[[], object], name: str) -> Runner: ...

    def call_handler(self, handler: Callable[[Any], object], arg: Any) -> object: ...

    def check_handler(self, handler: object) -> None:
        """Raise TypeError for a handler this runtime cannot run."""
        ...


def jittered(delay: float) -> float:
    """``delay`` +-50 % (idle waits, so processes do not poll in lockstep)."""
    return delay * random.uniform(0.5, 1.5)


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (``async def``, a partial of
    one, or an object whose ``__call__`` is one)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself is inspected
    )


# -- threads ------------------------------------------------------------------------------


class _Thread(threading.Thread):
    def is_current(self) -> bool:
        return self is threading.current_thread()


class _Threads:
    def event(self) -> Event:
        return threading.Event()

    def condition(self, lock: threading.Lock) -> Condition:
        return threading.Condition(lock)

    def spawn(self, target: Callable[[], object], name: str) -> Runner:
        # Daemon: a stuck handler must not keep the process alive.
        thread = _Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def call_handler(self, handler: Callable[[Any], object], arg: Any) -> object:
        return handler(arg)

    def check_handler(self, handler: object) -> None:
        if is_async_callable(handler):
            raise TypeError(
                "handler is an async function: novaque.Client runs handlers on threads; "
                "give it a plain function, or use novaque.aio.AsyncClient, whose consumers "
                "await async handlers as tasks"
            )


THREADS: Waits = _Threads()


# -- tasks --------------------------------------------------------------------------------
#
# Every method below is called from inside the greenlet bridge, on the event
# loop's thread; ``set`` (a wake-up) may also come from another thread.


def _await(awaitable: Awaitable[Any]) -> Any:
    from sqlalchemy.util import await_only

    return await_only(awaitable)


class _TaskEvent:
    """``threading.Event``'s methods for tasks, waited on through the bridge.

    A wait awaits a future of its own, with a timer for its timeout: one turn
    of the loop from :meth:`set` to the waiting task (``asyncio.wait_for`` on
    an ``asyncio.Event`` took three: its task, the event's future, the
    outer future).
    """

    def __init__(self) -> None:
        self._flag = False
        self._waiters: list[asyncio.Future[bool]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def set(self) -> None:
        loop = self._loop
        if loop is None or running_loop() is loop:
            self._set_here()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._set_here)

    def _set_here(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _settle(waiter, True)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        loop = self._loop = asyncio.get_running_loop()
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        try:
            _await_until(loop, waiter, timeout)
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        return self._flag


def _settle(waiter: asyncio.Future[bool], value: bool) -> None:
    """Wake ``waiter`` with ``value`` (True: woken, False: timed out), once."""
    if not waiter.done():
        waiter.set_result(value)


def _await_until(
    loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[bool], timeout: float | None
) -> bool:
    """Await ``waiter`` through the bridge for at most ``timeout`` seconds; its
    result (False when the timeout settled it)."""
    timer = None if timeout is None else loop.call_later(timeout, _settle, waiter, False)
    try:
        return bool(_await(waiter))
    finally:
        if timer is not None:
            timer.cancel()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _TaskCondition:
    """``threading.Condition``'s methods for tasks, on a ``threading.Lock``.

    The lock is only ever held between two awaits (never across one), so on
    the loop's thread it is never found taken by another task; waiting
    releases it, like ``threading.Condition.wait``.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._waiters: list[asyncio.Future[bool]] = []

    def wait(self, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        self._lock.release()
        try:
            return _await_until(loop, waiter, timeout)
        finally:
            self._lock.acquire()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def notify(self, n: int = 1) -> None:
        woken = 0
        for waiter in list(self._waiters):
            if woken >= n:
                return
            if not waiter.done():
                waiter.set_result(True)
                woken += 1
            self._waiters.remove(waiter)

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class _Task:
    def __init__(self, task: asyncio.Task[object]) -> None:
        self._task = task

    def join(self, timeout: float | None = None) -> None:
        if timeout is not None and timeout <= 0:
            return
        _await(asyncio.wait({self._task}, timeout=timeout))

    def is_alive(self) -> bool:
        return not self._task.done()

    def is_current(self) -> bool:
        return self._task is asyncio.current_task()


class _Tasks:
    def event(self) -> Event:
        return _TaskEvent()

    def condition(self, lock: threading.Lock) -> Condition:
        return _TaskCondition(lock)

    def spawn(self, target: Callable[[], object], name: str) -> Runner:
        from sqlalchemy.util import greenlet_spawn

        return _Task(asyncio.get_running_loop().create_task(greenlet_spawn(target), name=name))

    def call_handler(self, handler: Callable[[Any], object], arg: Any) -> object:
        return _await(handler(arg))  # type: ignore[arg-type]

    def check_handler(self, handler: object) -> None:
        if not is_async_callable(handler):
            raise TypeError(
                "handler must be an async function (async def handler(msg)): "
                "novaque.aio.AsyncClient awaits handlers as tasks on its event loop; "
                "a plain function would block the loop (use novaque.Client for those)"
            )


TASKS: Waits = _Tasks()
