"""novaque's asyncio twin: :class:`AsyncClient`, :func:`connect`, :class:`AsyncConsumer`.

Every method of :class:`novaque.Client` is a coroutine here, with the same
name, parameters, defaults, results and errors::

    import novaque, novaque.aio

    client = novaque.aio.AsyncClient(async_engine, novaque.Options(max_in_flight=8))
    await client.migrate()
    async with client:                       # await start() ... await shutdown()
        consumer = client.subscribe("events", "indexer", handler)  # async def handler(msg)
        await consumer.start()
        async with AsyncSession(async_engine) as session, session.begin():
            session.add(order)
            await client.publish("events", b"...", session=session)
        await consumer.shutdown(timeout=10)

One implementation serves both twins. The asyncio client runs the sync
client's own code on the ``AsyncEngine``'s ``sync_engine`` inside SQLAlchemy's
greenlet bridge (``greenlet_spawn``'s protocol, what ``AsyncConnection.run_sync``
does, in greenlets kept for the next call: ``novaque._bridge``):
each statement is awaited on the event loop by the async driver, and every
wait (SQLite's writer turn, a retry's pause, a consumer idling, a heartbeat's
tick) is an ``await``, so one event loop serves the application and novaque
together, with no threads. The operations, their SQL, their errors and their
results are the very same; only how a statement is executed and how a
consumer waits differ.

Consumers run their loops as tasks (the claim loop, ``max_in_flight``
workers, the settler, the heartbeat) with the sync consumer's rules; a
worker awaits the handler, so at most ``max_in_flight`` handlers of a
consumer run at once. PostgreSQL wake-ups are read from a ``LISTEN`` on a
psycopg ``AsyncConnection``.

Drivers: psycopg 3 (``postgresql+psycopg://``), asyncmy (``mysql+asyncmy://``,
the one ``pip install 'novaque[aio]'`` installs) or aiomysql
(``mysql+aiomysql://``, whose 0.3.2 release cannot send ``bytes`` with PyMySQL
1.2, aio-libs/aiomysql#1080: bodies fail there), aiosqlite
(``sqlite+aiosqlite:///``). Use a client on the event loop it was first used
on (like SQLAlchemy's ``AsyncEngine``, whose connections belong to one loop).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from novaque import _validate, dialects
from novaque._bridge import bridged
from novaque._context import transaction_timeout
from novaque._core import parts_of
from novaque._executor import AsyncExecutor
from novaque._signals import Signals
from novaque._waits import TASKS
from novaque.client import Client, pooled_options, runtime_of
from novaque.consumer import Consumer, signals_of
from novaque.errors import InvalidOption
from novaque.models import Message
from novaque.options import Backoff, Duration, Options

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncHandler", "connect"]

P = ParamSpec("P")
T = TypeVar("T")

#: A message handler of the asyncio twin: ``async def handler(msg)``; return
#: to ack, raise to retry, raise :class:`novaque.Reject` to dead-letter,
#: :class:`novaque.Defer` to set aside, :class:`novaque.Snooze` to put back.
AsyncHandler = Callable[[Message], Coroutine[Any, Any, object]]


class _Core(Client):
    """The sync client, run inside the greenlet bridge: its statements are
    awaited (:class:`~novaque._executor.AsyncExecutor`) and its loops are
    tasks (:data:`~novaque._waits.TASKS`)."""

    _executor_type = AsyncExecutor
    _waits = TASKS

    def _new_executor(self, engine: sa.Engine, dialect: dialects.Dialect) -> AsyncExecutor:
        return AsyncExecutor(
            engine,
            dialect,
            timeout=transaction_timeout(self.options),
            sqlite_on_loop=self.options.sqlite_on_loop,
        )


def _bridged(
    method: Callable[Concatenate[Client, P], T],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The coroutine twin of a :class:`Client` method: the same parameters,
    result, errors and documentation, run through the greenlet bridge."""

    async def twin(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await bridged(functools.partial(method, self._core, *args, **kwargs))

    functools.update_wrapper(twin, method)
    twin.__qualname__ = f"AsyncClient.{method.__name__}"
    return twin


class AsyncClient:
    """A handle on novaque's tables behind an ``AsyncEngine``: :class:`novaque.Client`
    for asyncio.

    ``AsyncClient(engine, options=None)`` touches no database; the first call
    that does checks once that the migrations were applied
    (:class:`~novaque.SchemaOutOfDate` otherwise). Every method of
    :class:`~novaque.Client` is a coroutine here with the same parameters,
    results and errors, but :meth:`subscribe`, a plain call that returns an
    :class:`AsyncConsumer`, and :meth:`claim_statement`. ``async with
    client:`` starts maintenance and shuts everything down at the end.
    """

    def __init__(self, engine: AsyncEngine, options: Options | None = None) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"AsyncClient needs a SQLAlchemy AsyncEngine, got {type(engine).__name__}"
                + _validate.sync_hint(engine)
            )
        #: The application's engine.
        self.engine = engine
        self._core = _Core(engine.sync_engine, options)
        #: The client's :class:`~novaque.Options` (the defaults when none were given).
        self.options = self._core.options
        #: The logger novaque logs to (``Options.logger``).
        self.log = self._core.log

    def __repr__(self) -> str:
        return f"<novaque.aio.AsyncClient {self.database_family} {self.engine.url!r}>"

    # -- accessors ------------------------------------------------------------------------

    @property
    def own_engine(self) -> AsyncEngine:
        """The engine novaque runs its own transactions on (see
        :attr:`novaque.Client.own_engine`): ``engine`` itself, except on SQLite
        with an engine not made by :func:`connect`."""
        own = self._core.own_engine
        return self.engine if own is self.engine.sync_engine else AsyncEngine(own)

    @property
    def database_family(self) -> str:
        """``"PostgreSQL"``, ``"MySQL"`` (MySQL and MariaDB) or ``"SQLite"``."""
        return self._core.database_family

    def claim_statement(self) -> sa.ClauseElement:
        """The statement behind :meth:`claim`, for :meth:`explain` (see
        :meth:`novaque.Client.claim_statement`)."""
        return self._core.claim_statement()

    # -- publishing (joining an AsyncConnection's or AsyncSession's transaction) ----------

    async def publish(
        self,
        topic: str,
        body: bytes | str,
        *,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        headers: dict[str, str] | None = None,
        dedup_key: str | None = None,
        group: str | None = None,
        priority: int = 0,
        connection: AsyncConnection | None = None,
        session: AsyncSession | None = None,
    ) -> int:
        """Publish one message to ``topic``; return its id (see
        :meth:`novaque.Client.publish`).

        With ``connection`` (an ``AsyncConnection``) or ``session`` (an
        ``AsyncSession``) the message joins that transaction and commits or
        rolls back with it.
        """
        conn, sess = _callers(connection, session)
        return await bridged(
            self._core.publish,
            topic,
            body,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_key=dedup_key,
            group=group,
            priority=priority,
            connection=conn,
            session=sess,
        )

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        *,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        headers: dict[str, str] | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        groups: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: AsyncConnection | None = None,
        session: AsyncSession | None = None,
    ) -> list[int]:
        """Publish many messages in one transaction; return their ids (see
        :meth:`novaque.Client.publish_many`)."""
        conn, sess = _callers(connection, session)
        return await bridged(
            self._core.publish_many,
            topic,
            bodies,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=dedup_keys,
            groups=groups,
            priority=priority,
            connection=conn,
            session=sess,
        )

    # -- consumers ------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        channel: str,
        handler: AsyncHandler,
        *,
        max_in_flight: int | None = None,
        lease: Duration | None = None,
        backoff: Backoff | None = None,
        poll_interval: Duration | None = None,
    ) -> AsyncConsumer:
        """A consumer that awaits ``handler`` (``async def handler(msg)``) on every
        message of ``topic``/``channel`` (see :meth:`novaque.Client.subscribe`).

        A plain call: it checks its arguments and returns an
        :class:`AsyncConsumer`; the topic and the channel are created when the
        consumer starts. A plain function raises ``TypeError``.
        """
        return AsyncConsumer(
            self,
            runtime_of(self._core).new_consumer(
                topic,
                channel,
                handler,
                max_in_flight=max_in_flight,
                lease=lease,
                backoff=backoff,
                poll_interval=poll_interval,
                register=True,
            ),
        )

    async def subscribe_and_start(
        self,
        topic: str,
        channel: str,
        handler: AsyncHandler,
        *,
        max_in_flight: int | None = None,
        lease: Duration | None = None,
        backoff: Backoff | None = None,
        poll_interval: Duration | None = None,
    ) -> AsyncConsumer:
        """:meth:`subscribe`, then :meth:`AsyncConsumer.start`; returns the running consumer."""
        consumer = self.subscribe(
            topic,
            channel,
            handler,
            max_in_flight=max_in_flight,
            lease=lease,
            backoff=backoff,
            poll_interval=poll_interval,
        )
        return await consumer.start()

    async def __aenter__(self) -> AsyncClient:
        """``async with client:`` starts maintenance and shuts everything down at the end."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # -- everything else: the sync client's methods, awaited --------------------------------

    migrate = _bridged(Client.migrate)
    downgrade = _bridged(Client.downgrade)
    start = _bridged(Client.start)
    shutdown = _bridged(Client.shutdown)
    explain = _bridged(Client.explain)
    ensure_topic = _bridged(Client.ensure_topic)
    ensure_channel = _bridged(Client.ensure_channel)
    channel_settings = _bridged(Client.channel_settings)
    pause_channel = _bridged(Client.pause_channel)
    resume_channel = _bridged(Client.resume_channel)
    delete_topic = _bridged(Client.delete_topic)
    delete_channel = _bridged(Client.delete_channel)
    list_topics = _bridged(Client.list_topics)
    list_channels = _bridged(Client.list_channels)
    claim = _bridged(Client.claim)
    pop = _bridged(Client.pop)
    ack = _bridged(Client.ack)
    ack_many = _bridged(Client.ack_many)
    requeue = _bridged(Client.requeue)
    snooze = _bridged(Client.snooze)
    reject = _bridged(Client.reject)
    defer = _bridged(Client.defer)
    claim_deferred = _bridged(Client.claim_deferred)
    release = _bridged(Client.release)
    renew = _bridged(Client.renew)
    run_maintenance = _bridged(Client.run_maintenance)
    reap_leases = _bridged(Client.reap_leases)
    purge_expired = _bridged(Client.purge_expired)
    enforce_dead_retention = _bridged(Client.enforce_dead_retention)
    flush_stats = _bridged(Client.flush_stats)
    prune_stats = _bridged(Client.prune_stats)
    forget_stale_consumers = _bridged(Client.forget_stale_consumers)
    fire_schedules = _bridged(Client.fire_schedules)
    schedule = _bridged(Client.schedule)
    unschedule = _bridged(Client.unschedule)
    get_schedule = _bridged(Client.get_schedule)
    list_schedules = _bridged(Client.list_schedules)
    pause_schedule = _bridged(Client.pause_schedule)
    resume_schedule = _bridged(Client.resume_schedule)
    channel_counters = _bridged(Client.channel_counters)
    topic_counters = _bridged(Client.topic_counters)
    daily_counters = _bridged(Client.daily_counters)
    minute_counters = _bridged(Client.minute_counters)
    list_consumers = _bridged(Client.list_consumers)
    channel_backlog = _bridged(Client.channel_backlog)
    topic_backlog = _bridged(Client.topic_backlog)
    list_dead = _bridged(Client.list_dead)
    requeue_dead = _bridged(Client.requeue_dead)
    delete_dead = _bridged(Client.delete_dead)
    get_message = _bridged(Client.get_message)
    list_messages = _bridged(Client.list_messages)
    cancel = _bridged(Client.cancel)
    replay = _bridged(Client.replay)
    replay_range = _bridged(Client.replay_range)
    prune = _bridged(Client.prune)
    compact = _bridged(Client.compact)


def _callers(
    connection: AsyncConnection | None, session: AsyncSession | None
) -> tuple[sa.Connection | None, Any]:
    """The sync objects behind a caller's AsyncConnection or AsyncSession."""
    conn: sa.Connection | None = None
    sess: Any = None
    if connection is not None:
        if not isinstance(connection, AsyncConnection):
            raise TypeError(
                "connection must be a SQLAlchemy AsyncConnection, got "
                f"{type(connection).__name__}{_validate.sync_hint(connection)}"
            )
        conn = connection.sync_connection
        if conn is None:
            raise InvalidOption(
                "the AsyncConnection given to publish is not connected: "
                "use it inside 'async with engine.connect() as connection'"
            )
    if session is not None:
        if not isinstance(session, AsyncSession):
            raise TypeError(
                "session must be a SQLAlchemy AsyncSession, got "
                f"{type(session).__name__}{_validate.sync_hint(session)}"
            )
        sess = session.sync_session
    return conn, sess


class AsyncConsumer:
    """Awaits a handler on the messages of one channel; made by
    :meth:`AsyncClient.subscribe`.

    The handler contract and the settings are :class:`novaque.Consumer`'s;
    :meth:`start` and :meth:`shutdown` are coroutines, :attr:`running` and
    :attr:`in_flight` the same properties. Its loops are tasks on the event
    loop that started it.
    """

    def __init__(self, client: AsyncClient, consumer: Consumer) -> None:
        self._client = client
        self._consumer = consumer

    def __repr__(self) -> str:
        return repr(self._consumer).replace("<novaque.Consumer", "<novaque.aio.AsyncConsumer", 1)

    async def start(self) -> AsyncConsumer:
        """Create the topic and the channel if missing, and start claiming and
        handling messages; returns the consumer (see :meth:`novaque.Consumer.start`)."""
        await bridged(runtime_of(self._client._core).start_consumer, self._consumer)
        return self

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop gracefully within ``timeout`` seconds (see :meth:`novaque.Consumer.shutdown`):
        unstarted deliveries are released at once, running handlers finish,
        pending results are written."""
        await bridged(self._consumer.shutdown, timeout)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._consumer.running

    @property
    def in_flight(self) -> int:
        """Deliveries this consumer holds a lease on and has not settled yet."""
        return self._consumer.in_flight

    @property
    def topic(self) -> str:
        """The topic it consumes."""
        return self._consumer.topic

    @property
    def channel(self) -> str:
        """The channel of :attr:`topic` it consumes."""
        return self._consumer.channel

    @property
    def handler(self) -> AsyncHandler:
        """The coroutine function it awaits on each message."""
        return self._consumer.handler  # type: ignore[return-value]

    @property
    def max_in_flight(self) -> int:
        """The most handlers it runs at once (its workers)."""
        return self._consumer.max_in_flight

    @property
    def lease(self) -> float:
        """The lease each claim takes, in seconds."""
        return self._consumer.lease

    @property
    def backoff(self) -> Backoff:
        """The retry delays after a handler raised."""
        return self._consumer.backoff

    @property
    def poll_interval(self) -> float:
        """The longest it idles between two claims when nothing is due, in seconds."""
        return self._consumer.poll_interval

    @property
    def _signals(self) -> Signals:
        return signals_of(self._consumer)


def core_of(client: AsyncClient) -> Client:
    """The sync client ``client`` runs inside the greenlet bridge (its calls
    must run there too: :func:`novaque._bridge.bridged`)."""
    return client._core


def connect(url: str | sa.URL, *, pgbouncer: bool = False, **option_fields: Any) -> AsyncClient:
    """An :class:`AsyncClient` on a new ``AsyncEngine`` for ``url``, set up the
    way novaque runs best (see :func:`novaque.connect`, ``pgbouncer`` too).

    ``url`` names an asyncio driver: ``postgresql+psycopg://``,
    ``mysql+asyncmy://`` or ``mysql+aiomysql://``, ``sqlite+aiosqlite:///``.
    A URL without a driver (``postgresql://`` or ``postgres://``, ``mysql://``,
    ``mariadb://``, ``sqlite:///``) gets psycopg, asyncmy or aiosqlite.
    """
    options = pooled_options(pgbouncer, option_fields)
    parsed = dialects.normalise_url(url, asynchronous=True)
    pool_size = dialects.pool_size_for(options.max_in_flight)
    try:
        sync_engine = dialects.create_engine(
            parsed, pool_size=pool_size, asynchronous=True, pgbouncer=pgbouncer
        )
    except sa.exc.InvalidRequestError as exc:
        raise InvalidOption(
            f"{parsed.drivername}:// is not an asyncio driver ({exc}); novaque.aio works "
            "with postgresql+psycopg://, mysql+asyncmy://, mysql+aiomysql:// and "
            "sqlite+aiosqlite:/// (novaque.connect with the others)"
        ) from None
    client = AsyncClient(AsyncEngine(sync_engine), options)
    parts_of(client._core).context.owns_engine = True  # closed by client.shutdown()
    return client
