"""The core of the synchronous client: the parts that publish, shape the
topology, claim and settle, and maintain, composed over one shared
:class:`~novaque._context.Context`. :class:`novaque.Client` adds the
operator's calls (:class:`novaque._operator_calls.Operations`) and the
consumer runtime (:class:`novaque._runtime.Runtime`) on top of
:class:`CoreClient`.
"""

from __future__ import annotations

import atexit
import functools
import operator
import os
import weakref
from collections.abc import Callable
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

import sqlalchemy as sa

from novaque import _migrate, _validate, dialects
from novaque._consuming import Consuming
from novaque._context import Context, transaction_timeout
from novaque._executor import SyncExecutor
from novaque._maintenance import Maintenance
from novaque._publishing import Publishing
from novaque._schedules import Schedules
from novaque._topology import Topology
from novaque._waits import THREADS, Waits
from novaque.options import Options

__all__ = ["CoreClient", "Parts", "forward", "parts_of"]

T = TypeVar("T")
P = ParamSpec("P")

#: Clients that counted something: their counters are flushed at a clean exit.
_unflushed: weakref.WeakSet[CoreClient] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for client in list(_unflushed):
        context = client._context
        if not context.stats:
            continue
        try:
            context.executor.detached(client._maintenance.flush_stats)
        except Exception as exc:
            context.log.warning(
                "novaque could not flush its counters at exit (they are lost): %s",
                _validate.error_text(exc),
            )


def _forget_parent_counters() -> None:
    """In a forked child: the counters buffered so far are the parent's to flush.

    Without this a child of a pre-forking server (Celery's prefork pool,
    gunicorn with ``--preload``) would flush them again at its exit, on the
    parent's connections.
    """
    for client in list(_unflushed):
        client._context.stats.forget()
    _unflushed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_counters)


def forward(
    part: str, method: Callable[Concatenate[Any, P], T]
) -> Callable[Concatenate[Any, P], T]:
    """The client method that forwards to ``method`` of the client's part
    ``part`` (the attribute that holds it): the same parameters, result,
    errors and documentation."""
    get = operator.attrgetter(part)

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(get(self), *args, **kwargs)

    functools.update_wrapper(call, method)
    call.__qualname__ = f"Client.{method.__name__}"
    return call


class Parts(NamedTuple):
    """The parts of a client's core, for the modules that work with them (the
    runtime, the asyncio twin, the integrations) instead of its attributes."""

    context: Context
    publishing: Publishing
    topology: Topology
    consuming: Consuming
    maintenance: Maintenance


class CoreClient:
    """A handle on novaque's tables in the database behind ``engine``.

    Creating a client touches no database. The first call that does checks once
    that the migrations were applied (:class:`~novaque.SchemaOutOfDate`
    otherwise). A client is safe to share between threads.

    On SQLite novaque runs its own transactions on a second engine opened on
    the same file, so that it can take the write lock up front (``BEGIN
    IMMEDIATE``) without changing how the application's own engine behaves.
    """

    #: How statements are executed: on threads here; awaited through
    #: SQLAlchemy's greenlet bridge for the asyncio twin.
    _executor_type: type[SyncExecutor] = SyncExecutor
    #: How the client waits (background loops, long polls, paced calls):
    #: threads' events here, asyncio's for the asyncio twin.
    _waits: Waits = THREADS

    def __init__(self, engine: sa.Engine, options: Options | None = None) -> None:
        if not isinstance(engine, sa.Engine):
            raise TypeError(
                f"Client needs a SQLAlchemy Engine, got {type(engine).__name__}"
                + _validate.async_hint(engine)
            )
        if engine.dialect.is_async != self._executor_type.asynchronous:
            raise TypeError(
                f"the engine's driver {engine.dialect.driver} is "
                + (
                    "asyncio's: use novaque.aio.AsyncClient with its AsyncEngine"
                    if engine.dialect.is_async
                    else "not an asyncio one: novaque.aio.AsyncClient needs one"
                )
            )
        #: The client's :class:`~novaque.Options` (the defaults when none were given).
        self.options = options if options is not None else Options()
        if not isinstance(self.options, Options):
            raise TypeError(f"options must be novaque.Options, got {type(options).__name__}")
        #: The application's engine, as given (or made by :func:`~novaque.connect`).
        self.engine = engine
        #: The logger novaque logs to (``Options.logger``).
        self.log = self.options.logger
        dialect = dialects.for_engine(engine)
        executor = self._new_executor(dialects.own_engine(engine), dialect)
        #: What the parts share: engine, executor, dialect, clock, counters, wakers.
        self._context = context = Context(engine, self.options, dialect, executor, self._waits)
        context.add_counters_listener(self._counters_added)
        self._publishing = Publishing(context)
        self._topology = Topology(context)
        self._consuming = Consuming(context, self._topology)
        self._maintenance = Maintenance(context)
        self._schedules = Schedules(context)

    def _new_executor(self, engine: sa.Engine, dialect: dialects.Dialect) -> SyncExecutor:
        """The executor of novaque's own transactions on ``engine``."""
        return self._executor_type(engine, dialect, timeout=transaction_timeout(self.options))

    def _counters_added(self) -> None:
        """Counters arrived in the empty buffer: they are flushed at exit at the latest."""
        _unflushed.add(self)

    def __repr__(self) -> str:
        return f"<novaque.Client {self._context.dialect.name} {self.engine.url.render_as_string()}>"

    # -- schema ---------------------------------------------------------------------

    def migrate(self, to: str = "head") -> None:
        """Apply novaque's migrations up to ``to`` (Alembic ``upgrade``).

        Checks the database version floor first (:class:`~novaque.UnsupportedDatabase`).
        Running it again is a no-op.
        """
        if _migrate.is_head(to):
            # Nothing to do (the usual case, once per worker process): no
            # lock, no Alembic, nothing logged.
            with self._context.executor.connect() as conn:
                self._context.dialect.check_floor(conn)
                if _migrate.is_current(conn):
                    return
        with self._context.executor.migration_transaction() as conn:
            self._context.dialect.check_floor(conn)
            with self._context.dialect.migration_lock(conn):
                before = _migrate.upgrade(conn, to)
        self._context.schema_changed()
        if _migrate.is_head(to):
            _migrate.remember(self.engine.url)
        after = _migrate.head() if _migrate.is_head(to) else to
        if before != after:
            self.log.info("novaque schema migrated from %s to %s", before or "base", after)

    def downgrade(self, to: str = "base") -> None:
        """Revert novaque's migrations down to ``to``; ``base`` drops every table."""
        with (
            self._context.executor.migration_transaction() as conn,
            self._context.dialect.migration_lock(conn),
        ):
            _migrate.downgrade(conn, to)
        _migrate.forget(self.engine.url)
        self._context.schema_changed()
        self._context.topic_ids.clear()
        self._publishing.forget_all()
        self._topology.forget_all()
        self.log.info("novaque schema downgraded to %s", to)

    # -- publishing (novaque._publishing) --------------------------------------------------

    publish = forward("_publishing", Publishing.publish)
    publish_many = forward("_publishing", Publishing.publish_many)

    # -- topology (novaque._topology) ------------------------------------------------------

    ensure_topic = forward("_topology", Topology.ensure_topic)
    ensure_channel = forward("_topology", Topology.ensure_channel)
    channel_settings = forward("_topology", Topology.channel_settings)
    pause_channel = forward("_topology", Topology.pause_channel)
    resume_channel = forward("_topology", Topology.resume_channel)
    delete_topic = forward("_topology", Topology.delete_topic)
    delete_channel = forward("_topology", Topology.delete_channel)
    list_topics = forward("_topology", Topology.list_topics)
    list_channels = forward("_topology", Topology.list_channels)

    # -- claiming and settling (novaque._consuming) ----------------------------------------

    claim = forward("_consuming", Consuming.claim)
    pop = forward("_consuming", Consuming.pop)
    claim_deferred = forward("_consuming", Consuming.claim_deferred)
    ack = forward("_consuming", Consuming.ack)
    ack_many = forward("_consuming", Consuming.ack_many)
    requeue = forward("_consuming", Consuming.requeue)
    snooze = forward("_consuming", Consuming.snooze)
    reject = forward("_consuming", Consuming.reject)
    defer = forward("_consuming", Consuming.defer)
    renew = forward("_consuming", Consuming.renew)
    release = forward("_consuming", Consuming.release)

    # -- schedules (novaque._schedules) --------------------------------------------------

    schedule = forward("_schedules", Schedules.schedule)
    unschedule = forward("_schedules", Schedules.unschedule)
    get_schedule = forward("_schedules", Schedules.get_schedule)
    list_schedules = forward("_schedules", Schedules.list_schedules)
    pause_schedule = forward("_schedules", Schedules.pause_schedule)
    resume_schedule = forward("_schedules", Schedules.resume_schedule)

    # -- maintenance (novaque._maintenance) ------------------------------------------------

    run_maintenance = forward("_maintenance", Maintenance.run_maintenance)
    reap_leases = forward("_maintenance", Maintenance.reap_leases)
    purge_expired = forward("_maintenance", Maintenance.purge_expired)
    flush_stats = forward("_maintenance", Maintenance.flush_stats)
    prune_stats = forward("_maintenance", Maintenance.prune_stats)
    forget_stale_consumers = forward("_maintenance", Maintenance.forget_stale_consumers)
    fire_schedules = forward("_maintenance", Maintenance.fire_schedules)


def parts_of(client: CoreClient) -> Parts:
    """The parts of ``client``'s core."""
    return Parts(
        client._context,
        client._publishing,
        client._topology,
        client._consuming,
        client._maintenance,
    )
