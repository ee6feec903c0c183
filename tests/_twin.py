"""The behaviour suite on the asyncio twin: the sync client's surface over an
:class:`novaque.aio.AsyncClient` whose calls are awaited on a background event loop.

A test written against :class:`novaque.Client` runs unchanged on the twin:
each call becomes ``await async_client.<same name>(...)`` on the loop, each
handler an ``async def`` that awaits the test's function on a thread (so a
handler that blocks on a test's event does not block the loop), and a
consumer an :class:`~novaque.aio.AsyncConsumer` whose loops are tasks. Private
attributes (what tests read: signals, counters buffered, the clock) are the
twin's own; private methods run inside the greenlet bridge on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import greenlet_spawn

import novaque
import novaque.aio

T = TypeVar("T")

#: The asyncio driver of each backend.
ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+asyncmy",
}
#: How long a call waits for the loop (a test's own deadline is usually shorter).
CALL_TIMEOUT_S = 120.0
#: The parts of the twin's client that tests reach (see :class:`_Part`).
_PARTS = frozenset(
    {"_context", "_publishing", "_topology", "_consuming", "_maintenance", "_runtime"}
)
#: Methods of the parts that do no I/O: called directly, not through the bridge.
_PLAIN = frozenset({"now", "counters_added", "add_waker", "remove_waker", "wake"})


def async_url(backend_name: str, url: str) -> sa.URL:
    return sa.make_url(url).set(drivername=ASYNC_DRIVERS[backend_name])


class Loop:
    """One event loop on a thread of its own, for the whole session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="twin-loop", daemon=True)
        self._thread.start()
        # Handlers are the tests' blocking functions: a thread each, many at once.
        self.handlers = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="twin-handler")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a twin call from the event loop's own thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_TIMEOUT_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.handlers.shutdown(wait=False, cancel_futures=True)


class SyncTwin:
    """:class:`novaque.Client`'s surface over an :class:`~novaque.aio.AsyncClient`."""

    def __init__(self, aclient: novaque.aio.AsyncClient, loop: Loop, engine: sa.Engine) -> None:
        self.aio = aclient
        self._loop = loop
        #: A sync engine on the same database, for the tests' own SQL.
        self.engine = engine

    def __repr__(self) -> str:
        return f"<SyncTwin of {self.aio!r}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            found = getattr(novaque.aio.core_of(self.aio), name)
            if name in _PARTS:
                return _Part(found, self._bridge)
            if inspect.ismethod(found):
                return self._bridge(found)
            return found
        found = getattr(self.aio, name)
        if inspect.iscoroutinefunction(found):
            return lambda *args, **kwargs: self._loop.run(found(*args, **kwargs))
        return found

    def _bridge(self, fn: Callable[..., T]) -> Callable[..., T]:
        def call(*args: Any, **kwargs: Any) -> T:
            return self._loop.run(greenlet_spawn(fn, *args, **kwargs))

        return call

    def subscribe(self, topic: str, channel: str, handler: Any, **settings: Any) -> TwinConsumer:
        pool, loop = self._loop.handlers, self._loop.loop
        wrapped = handler
        if callable(handler):

            async def wrapped(msg: novaque.Message) -> object:
                # In the handler task's context, as an async handler runs (what
                # the task's context holds, an OpenTelemetry span, is the handler's).
                context = contextvars.copy_context()
                return await loop.run_in_executor(pool, context.run, handler, msg)

        consumer = TwinConsumer(self.aio.subscribe(topic, channel, wrapped, **settings), self)
        # The sync subscribe creates the channel; the twin's does no I/O (its
        # consumer creates the channel at start): as an application would, the
        # channel is declared first, so what is published before start is kept.
        self.ensure_channel(topic, channel)
        return consumer

    def subscribe_and_start(self, *args: Any, **kwargs: Any) -> TwinConsumer:
        return self.subscribe(*args, **kwargs).start()

    def __enter__(self) -> SyncTwin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def close(self) -> None:
        """Shut the twin down and close its engines (the end of a test)."""
        self.shutdown(timeout=10)
        self._loop.run(self.aio.engine.dispose())
        self.engine.dispose()


class _Part:
    """A part of the twin's client (its context, publishing, topology,
    consuming, maintenance, runtime) as tests see it: attributes as they are,
    methods run inside the greenlet bridge on the loop (but those that do no
    I/O, :data:`_PLAIN`)."""

    def __init__(self, part: object, bridge: Callable[[Callable[..., Any]], Callable[..., Any]]):
        self._part = part
        self._bridge = bridge

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._part, name)
        if inspect.ismethod(found) and name not in _PLAIN:
            return self._bridge(found)
        return found


class TwinConsumer:
    """:class:`novaque.Consumer`'s surface over an :class:`~novaque.aio.AsyncConsumer`."""

    def __init__(self, aconsumer: novaque.aio.AsyncConsumer, client: SyncTwin) -> None:
        self.aio = aconsumer
        self._client = client

    def __repr__(self) -> str:
        return repr(self.aio)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aio._consumer, name)

    def start(self) -> TwinConsumer:
        self._client._loop.run(self.aio.start())
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self._client._loop.run(self.aio.shutdown(timeout))


def make(
    backend_name: str,
    url: str,
    loop: Loop,
    options: novaque.Options,
    connect_args: dict[str, Any] | None = None,
) -> SyncTwin:
    """A twin client on the backend's database (its engine built on the loop;
    ``connect_args``: the driver's, of both engines)."""
    args = connect_args or {}

    async def build() -> novaque.aio.AsyncClient:
        engine = create_async_engine(async_url(backend_name, url), connect_args=args)
        return novaque.aio.AsyncClient(engine, options)

    return SyncTwin(loop.run(build()), loop, sa.create_engine(url, connect_args=args))
