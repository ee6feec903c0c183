"""The synchronous client, and :func:`connect` for users without an engine."""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa

from novaque import dialects
from novaque._core import CoreClient, forward, parts_of
from novaque._operator_calls import Operations
from novaque._runtime import Runtime
from novaque.errors import InvalidOption
from novaque.options import Options

__all__ = ["Client", "connect"]

_C = TypeVar("_C", bound="Client")


class Client(CoreClient):
    """A handle on novaque's tables in the database behind ``engine``.

    ``Client(engine, options=None)`` touches no database. The first call that
    does checks once that the migrations were applied
    (:class:`~novaque.SchemaOutOfDate` otherwise). A client is safe to share
    between threads; create one per process.

    On SQLite novaque runs its own transactions on a second engine opened on
    the same file, so that it can take the write lock up front (``BEGIN
    IMMEDIATE``) without changing how the application's engine behaves.
    """

    def __init__(self, engine: sa.Engine, options: Options | None = None) -> None:
        super().__init__(engine, options)
        #: The operator's calls (counters, backlog, dead letters, browsing,
        #: replay, prune, compact), forwarded to below.
        self._operations = Operations(self._context, self._maintenance)
        #: Consumers, the maintenance loop and wake-ups, forwarded to below.
        self._runtime = Runtime(parts_of(self))

    # -- the runtime (novaque._runtime) ---------------------------------------------------

    subscribe = forward("_runtime", Runtime.subscribe)
    subscribe_and_start = forward("_runtime", Runtime.subscribe_and_start)
    start = forward("_runtime", Runtime.start)
    shutdown = forward("_runtime", Runtime.shutdown)

    def __enter__(self: _C) -> _C:
        """``with client:`` starts maintenance and shuts everything down at the end."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- the operator's calls (novaque._operator_calls) -------------------------------------

    channel_counters = forward("_operations", Operations.channel_counters)
    topic_counters = forward("_operations", Operations.topic_counters)
    daily_counters = forward("_operations", Operations.daily_counters)
    minute_counters = forward("_operations", Operations.minute_counters)
    list_consumers = forward("_operations", Operations.list_consumers)
    channel_backlog = forward("_operations", Operations.channel_backlog)
    topic_backlog = forward("_operations", Operations.topic_backlog)
    list_dead = forward("_operations", Operations.list_dead)
    requeue_dead = forward("_operations", Operations.requeue_dead)
    delete_dead = forward("_operations", Operations.delete_dead)
    enforce_dead_retention = forward("_operations", Operations.enforce_dead_retention)
    get_message = forward("_operations", Operations.get_message)
    list_messages = forward("_operations", Operations.list_messages)
    cancel = forward("_operations", Operations.cancel)
    replay = forward("_operations", Operations.replay)
    replay_range = forward("_operations", Operations.replay_range)
    prune = forward("_operations", Operations.prune)
    compact = forward("_operations", Operations.compact)

    # -- accessors ----------------------------------------------------------------------

    @property
    def own_engine(self) -> sa.Engine:
        """The engine novaque runs its own transactions on.

        ``engine`` itself, except on SQLite when the engine was not made by
        :func:`connect`: then a second engine on the same file, set up to take
        the write lock up front. :meth:`shutdown` disposes of that second
        engine; tools that only read may use it or ``engine``.
        """
        return self._context.executor.engine

    @property
    def database_family(self) -> str:
        """Which family of databases the client works with.

        ``"PostgreSQL"``, ``"MySQL"`` (MySQL and MariaDB) or ``"SQLite"``.
        """
        return self._context.dialect.name

    def claim_statement(self) -> sa.ClauseElement:
        """The statement behind :meth:`claim` on this database, for :meth:`explain`.

        Its parameters: ``p_channel`` (channel id), ``p_now`` and ``p_until``
        (epoch microseconds: the time now and the lease's end), ``p_limit``,
        ``p_token`` (a lease token, 32 characters).
        """
        return self._context.dialect.claim_statement()

    def explain(
        self, statement: sa.ClauseElement, params: dict[str, Any], *, analyze: bool = False
    ) -> str:
        """The database's plan for ``statement`` with ``params``, as text.

        One line per row of the database's ``EXPLAIN`` output (SQLite:
        ``EXPLAIN QUERY PLAN``). ``analyze`` runs the statement and reports
        real timings where the database can (PostgreSQL ``EXPLAIN (ANALYZE,
        BUFFERS)``, MySQL ``EXPLAIN ANALYZE``, MariaDB ``ANALYZE``); it runs on
        a connection of ``engine`` whose transaction is rolled back afterwards,
        so even a claim leaves no lease behind. ``params`` fill the statement's
        bound parameters (a list for an expanding one, as in ``IN``).
        """
        with self.engine.connect() as conn:
            try:
                return self._context.dialect.explain(conn, statement, params, analyze=analyze)
            finally:
                conn.rollback()


def runtime_of(client: Client) -> Runtime:
    """The runtime of ``client`` (its consumers, maintenance loop and wake-ups)."""
    return client._runtime


def operations_of(client: Client) -> Operations:
    """The operator's calls of ``client``."""
    return client._operations


def connect(url: str | sa.URL, *, pgbouncer: bool = False, **option_fields: Any) -> Client:
    """A client on a new engine for ``url``, set up the way novaque runs best.

    Keyword arguments are :class:`Options` fields. SQLite gets WAL, a busy
    timeout and ``BEGIN IMMEDIATE`` writes; PostgreSQL and MySQL get a pool
    sized for the consumers' worker threads whose connections are pinged
    before use after a second idle. MySQL/MariaDB connections run in READ
    COMMITTED (also for the application's own work on ``client.engine``) and
    are rolled back on return to the pool only when a transaction is open.
    A new PostgreSQL connection may take 10 s at most (libpq's
    ``connect_timeout``, unless the URL sets one).

    ``pgbouncer=True``: PostgreSQL through PgBouncer in transaction pooling
    (or any pooler that hands a connection's transactions to server sessions
    in turn): psycopg's server-side prepared statements are off
    (``prepare_threshold=None``) and ``Options.listen`` is False (consumers
    poll every ``poll_interval``).
    """
    options = pooled_options(pgbouncer, option_fields)
    engine = dialects.create_engine(
        url, pool_size=dialects.pool_size_for(options.max_in_flight), pgbouncer=pgbouncer
    )
    if engine.dialect.is_async:
        engine.dispose()
        raise InvalidOption(
            f"{engine.url.drivername}:// is an asyncio driver: use novaque.aio.connect "
            "for novaque.aio.AsyncClient, or a sync driver (postgresql+psycopg://, "
            "mysql+pymysql://, sqlite:///) here"
        )
    client = Client(engine, options)
    client._context.owns_engine = True  # closed by client.shutdown()
    return client


def pooled_options(pgbouncer: bool, option_fields: dict[str, Any]) -> Options:
    """The :class:`Options` of :func:`connect`: ``option_fields``, and with
    ``pgbouncer`` no wake-up connection (``listen=False``)."""
    if not isinstance(pgbouncer, bool):
        raise InvalidOption(f"pgbouncer must be True or False, got {type(pgbouncer).__name__}")
    if pgbouncer:
        if option_fields.get("listen", False) is not False:
            raise InvalidOption(
                "listen=True cannot work with pgbouncer=True: LISTEN does not reach a "
                "client through transaction pooling (leave listen out)"
            )
        option_fields = {**option_fields, "listen": False}
    return Options(**option_fields)
