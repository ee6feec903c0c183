"""The asyncio twin's way into the sync code: SQLAlchemy's greenlet bridge, with
its greenlets kept for the next call.

:func:`bridged` is ``sqlalchemy.util.greenlet_spawn``: it runs a sync function
in a greenlet whose ``await_only`` calls hand their awaitables to the calling
coroutine, which awaits them on the event loop and hands back the result. Where
``greenlet_spawn`` makes a new greenlet per call, this keeps finished ones per
thread and runs the next call in one of them: on CPython 3.11 a new greenlet
starts with a new frame stack, whose first deep call maps and faults in fresh
memory, about 20 µs of a one-message publish on SQLite (a sync publish there
is 300 µs). Everything else is the same protocol, so ``await_only`` and
SQLAlchemy's asyncio adaptation work inside unchanged: the greenlet says it
provides the bridge (``__sqlalchemy_greenlet_provider__``), runs with the
caller's ``contextvars`` context, and an exception thrown into an awaiting
call (a task's cancellation) goes on in the function, which may catch it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from greenlet import GreenletExit, getcurrent, greenlet  # type: ignore[import-untyped]

T = TypeVar("T")

#: Finished greenlets kept per thread (a greenlet runs in its own thread only).
_KEPT = 8


class _Done:
    """What a call ended with: its result, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


class _Carrier(greenlet):  # type: ignore[misc]  # greenlet ships no stubs for subclassing
    """A greenlet that runs one call after another, switching back to whoever
    started each with a :class:`_Done`, and to it with an awaitable whenever
    the call awaits (``await_only`` switches to the parent)."""

    __sqlalchemy_greenlet_provider__ = True

    def __init__(self) -> None:
        super().__init__(self._serve, getcurrent())

    def _serve(self, call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> None:
        while True:
            fn, args, kwargs = call
            try:
                done = _Done(fn(*args, **kwargs), None)
            except GreenletExit:
                raise  # collected while suspended: end, as any greenlet does
            except BaseException as exc:
                done = _Done(None, exc)
            del fn, args, kwargs
            call = self.parent.switch(done)


_kept = threading.local()


async def bridged(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``await bridged(fn, *args, **kwargs)``: ``fn(*args, **kwargs)`` inside the
    greenlet bridge (see the module's documentation); its result, or its error."""
    free: list[_Carrier] | None = getattr(_kept, "free", None)
    if free is None:
        free = _kept.free = []
    carrier = free.pop() if free else _Carrier()
    here = getcurrent()
    carrier.parent = here
    carrier.gr_context = here.gr_context
    step = carrier.switch((fn, args, kwargs))
    while not isinstance(step, _Done):
        try:
            value = await step
        except BaseException:
            step = carrier.throw(*sys.exc_info())
        else:
            step = carrier.switch(value)
    if len(free) < _KEPT:
        free.append(carrier)
    if step.error is not None:
        error, step.error = step.error, None
        raise error
    result: T = step.value
    return result
