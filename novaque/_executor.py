"""How novaque's own transactions are run: the one door to the database.

:class:`SyncExecutor` runs a function of a connection in one transaction on
novaque's engine, and retries it when the database reports a conflict that a
repeat can cure (deadlock, serialization failure, busy: the dialect's
``is_retryable``). It also owns what depends on how statements are executed
rather than on their SQL:

- SQLite's one writer: novaque's threads take turns per file, before they
  meet in SQLite's busy handler (the dialect's ``one_writer``);
- autocommit for work the dialect does in one statement (``one_statement``:
  PostgreSQL's publish, claim and ack cost one round trip, not three);
- the dialect's first statement of a transaction (``begin_transaction``:
  MySQL's SET TRANSACTION READ COMMITTED), skipped on engines made by
  :func:`novaque.connect`, set up once per connection instead;
- the driver path: the hottest operations (a publish of one message, a
  claim, an ack with the next claim), named by ``op=``, are handed a
  :class:`~novaque.dialects.params.Driver` instead of a SQLAlchemy
  connection where the dialect writes them in the driver's own SQL
  (``driver_ops``): the dialect then runs the whole transaction on a pooled
  DBAPI connection, without SQLAlchemy's statement machinery (its cost was
  half of a publish's), unless the engine has cursor events or logs its SQL.

The dialect (:mod:`novaque.dialects`) holds only SQL and facts about its
database.

:class:`AsyncExecutor` is the same executor for an ``AsyncEngine``'s
``sync_engine``, called from inside SQLAlchemy's greenlet bridge
(:func:`novaque._bridge.bridged`, ``greenlet_spawn``'s protocol, as
``AsyncConnection.run_sync`` uses it): the operations and the transactions are
the very same code; only what waits differs. SQLite's turn among the loop's
tasks (:class:`_LoopTurn`) and the pause between retries (``asyncio.sleep``)
are awaited through the bridge, so a task that waits lets the event loop run
the others instead of blocking its thread. On SQLite each
transaction runs whole on a sync engine: on the loop's thread when the file's
write lock is free (SQLite told not to wait there), else on a thread of the
client's (one hop, where aiosqlite makes about four per statement). On an
engine :func:`novaque.aio.connect` built for PostgreSQL, one-statement work
runs on a pool kept in autocommit (psycopg's async connections switch it with
an awaited call).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.util import await_only, greenlet_spawn

from novaque import _deadlines
from novaque._waits import running_loop
from novaque.dialects import Dialect, NotifyListener
from novaque.dialects.engines import autocommit_engine, session_ready, sync_sqlite_engine
from novaque.dialects.params import Driver, Link
from novaque.errors import DatabaseUnavailable

T = TypeVar("T")
C = TypeVar("C")

#: How often a transaction is tried before its last error is raised.
ATTEMPTS = 8

#: One lock per SQLite file: novaque's transactions in one process take turns on it.
_write_locks: dict[str, threading.RLock] = {}
_write_locks_guard = threading.Lock()


def _write_lock(engine: sa.Engine) -> threading.RLock:
    """The turn of novaque's transactions in this process on ``engine``'s SQLite file."""
    with _write_locks_guard:
        return _write_locks.setdefault(engine.url.database or "", threading.RLock())


class SyncExecutor:
    """Runs novaque's own transactions on ``engine`` for ``dialect``'s database."""

    #: Whether it runs on an asyncio driver, inside the greenlet bridge.
    asynchronous = False

    def __init__(
        self, engine: sa.Engine, dialect: Dialect, *, timeout: float | None = None
    ) -> None:
        #: The engine novaque runs its own transactions on.
        self.engine = engine
        self.dialect = dialect
        #: Longest a transaction may take before it is cancelled
        #: (``Options.transaction_timeout``), where the dialect can cancel one.
        self.timeout = timeout if dialect.can_cancel else None
        self._turn: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if dialect.one_writer:
            self._turn = _write_lock(engine)
        self._autocommit = bool(dialect.one_statement_ops)
        #: Where one-statement work runs when a pool stays in autocommit.
        self._autocommit_engine = autocommit_engine(engine) if self._autocommit else None
        self._begin = not session_ready(engine)
        #: Whether the operations the dialect writes for the driver take that
        #: path (the tests run them both ways).
        self.use_driver = True
        self._driver_ops: frozenset[str] | None = None

    def run(self, fn: Callable[[Link], T], *, op: str = "", attempts: int = ATTEMPTS) -> T:
        """Run ``fn`` in one transaction on novaque's engine, retrying conflicts.

        ``op`` names the hot operation ``fn`` performs, if it is one. Where the
        dialect writes it for the driver (:meth:`drives`), ``fn`` is handed a
        :class:`~novaque.dialects.params.Driver`, on which the dialect runs
        the transaction itself; else a SQLAlchemy connection in a transaction
        of the executor's. Where the dialect does the operation in one
        statement (``one_statement_ops``), that transaction is the statement
        alone, in autocommit, saving the round trips of BEGIN and COMMIT.
        """
        return self._run(fn, op, self.drives(op), attempts)

    def _run(self, fn: Callable[[Link], T], op: str, driver: bool, attempts: int) -> T:
        """:meth:`run`, the path chosen (``driver``)."""
        if driver:
            engine = self._autocommit_engine or self.engine
            return self._retried(functools.partial(_on_driver, engine, fn, self), attempts)
        one_statement = op in self.dialect.one_statement_ops
        return self._retried(functools.partial(self._in_transaction, fn, one_statement), attempts)

    def drives(self, op: str) -> bool:
        """Whether operation ``op`` is handed a :class:`~novaque.dialects.params.Driver`:
        the dialect writes it for this engine's driver (``driver_ops``), and
        nothing of the engine watches its statements (cursor events, such as
        SQLAlchemy's OpenTelemetry instrumentation, error handlers, or SQL
        logging), which the driver path would skip."""
        if not op or not self.use_driver:
            return False
        ops = self._driver_ops
        if ops is None:
            ops = self._driver_ops = self.dialect.driver_ops(self.engine.dialect)
        if op not in ops:
            return False
        engine = self.engine
        dispatch = engine.dispatch
        return not (
            dispatch.before_cursor_execute
            or dispatch.after_cursor_execute
            or engine.dialect.dispatch.handle_error
            or engine.logger.isEnabledFor(logging.INFO)
        )

    def _in_transaction(self, fn: Callable[[Link], T], one_statement: bool) -> T:
        with self._transaction(one_statement) as conn:
            return fn(conn)

    def _retried(self, attempt_once: Callable[[], T], attempts: int) -> T:
        """``attempt_once()`` in this executor's turn, tried again after a conflict
        that a repeat can cure (the dialect's ``is_retryable``), up to ``attempts``."""
        with self._turn:
            for attempt in range(1, attempts + 1):
                try:
                    return attempt_once()
                except DBAPIError as exc:
                    if attempt == attempts or not self.dialect.is_retryable(exc):
                        self.raise_unavailable(exc)
                        raise
                    self.pause(random.uniform(0, 0.002 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def opened(self, connect: Callable[[], C]) -> C:
        """``connect()``: a connection of an engine (or its pool). One that
        cannot be opened (the server does not answer, refuses, or is not the
        primary a multi-host URL asks for) raises
        :class:`DatabaseUnavailable`, unless a repeat may cure it (the
        dialect's ``is_retryable``: SQLite's lock, met by its connection's
        pragmas)."""
        dialect = self.engine.dialect
        try:
            return connect()
        except (DBAPIError, dialect.loaded_dbapi.Error) as exc:
            # A pool's raw connection raises the driver's own error.
            error = exc if isinstance(exc, DBAPIError) else _wrapped(exc, dialect)
            if self.dialect.is_retryable(error):
                if error is exc:
                    raise
                raise error from exc
            raise DatabaseUnavailable(
                f"could not connect to the database ({_first_line(error.orig)}): try again "
                "once it answers"
            ) from error

    def raise_unavailable(self, exc: DBAPIError) -> None:
        """Raise :class:`DatabaseUnavailable` from ``exc`` if the dialect says it
        is one (:meth:`~novaque.dialects.Dialect.is_unavailable`)."""
        if self.dialect.is_unavailable(exc):
            raise DatabaseUnavailable(
                f"the database is unavailable ({_first_line(exc.orig)}): try again once it "
                "answers; the call may have committed before the answer was lost (a "
                "publish with a dedup_key is safe to repeat)"
            ) from exc

    def _deadline(self, conn: sa.Connection) -> contextlib.AbstractContextManager[object]:
        """Bound the transaction on ``conn`` by :attr:`timeout` (none: nothing)."""
        if self.timeout is None:
            return _UNBOUNDED
        return self.deadline(conn.connection.driver_connection, conn.invalidate)

    def deadline(
        self, driver_conn: Any, invalidate: Callable[[], None]
    ) -> contextlib.AbstractContextManager[object]:
        """Cancel what runs on ``driver_conn`` once :attr:`timeout` passes; then
        ``invalidate`` the connection and raise :class:`DatabaseUnavailable`,
        whatever the driver answered (a commit's wait for a synchronous standby
        that was cancelled committed without the replication asked for)."""
        assert self.timeout is not None
        return _Bounded(self.timeout, self.dialect.cancel, driver_conn, invalidate)

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` before trying again."""
        time.sleep(seconds)

    def mutex(self) -> contextlib.AbstractContextManager[object]:
        """A lock that may be held across statements (the client's schema check)."""
        return threading.Lock()

    @contextlib.contextmanager
    def _transaction(self, one_statement: bool) -> Iterator[sa.Connection]:
        if one_statement and self._autocommit_engine is not None:
            with self.opened(self._autocommit_engine.connect) as conn, self._deadline(conn):
                yield conn
            return
        if one_statement and self._autocommit:
            # A single statement is a transaction by itself: in autocommit it
            # costs one round trip instead of three (BEGIN, statement, COMMIT),
            # with the same atomicity and durability. psycopg switches
            # autocommit on the client side, and the pool switches it back
            # when the connection returns.
            with self.opened(self.engine.connect) as conn, self._deadline(conn):
                yield conn.execution_options(isolation_level="AUTOCOMMIT")
            return
        # The deadline covers the commit (and its wait for a standby).
        with self.opened(self.engine.connect) as conn, self._deadline(conn), conn.begin():
            if self._begin:
                self.dialect.begin_transaction(conn)
            yield conn

    @contextlib.contextmanager
    def connect(self) -> Iterator[sa.Connection]:
        """A connection on novaque's engine, for reads outside :meth:`run`; its
        errors and deadline are those of :meth:`run`'s transactions."""
        try:
            with self.opened(self.engine.connect) as conn, self._deadline(conn):
                yield conn
        except DBAPIError as exc:
            self.raise_unavailable(exc)
            raise

    @contextlib.contextmanager
    def migration_transaction(self) -> Iterator[sa.Connection]:
        """The transaction that :meth:`Client.migrate` and ``downgrade`` run in
        (no deadline: a migration may build an index on a large table)."""
        try:
            with (
                self.opened(self.engine.connect) as conn,
                self.dialect.migration_session(conn),
                conn.begin(),
            ):
                yield conn
                self.dialect.check_migration(conn)
        except DBAPIError as exc:
            self.raise_unavailable(exc)
            raise

    def without_transaction(self, fn: Callable[[sa.Connection], T]) -> T:
        """``fn`` of a connection of novaque's engine on which no transaction was
        begun, for what cannot run in one (SQLite's ``VACUUM``), in this
        executor's turn and with its retries, but without a deadline (a
        ``VACUUM`` rewrites the whole file). ``fn`` runs its statements on
        the driver's connection: SQLAlchemy's would begin a transaction."""
        return self._retried(functools.partial(self._untransacted, fn), ATTEMPTS)

    def _untransacted(self, fn: Callable[[sa.Connection], T]) -> T:
        with self.opened(self.engine.connect) as conn:
            return fn(conn)

    def open_listener(self) -> NotifyListener | None:
        """A connection that receives the dialect's wake-ups, or None (consumers poll)."""
        return self.dialect.open_listener(self.engine)

    def open_watcher(self, interval: float, idle_interval: float | None = None) -> NotifyListener:
        """The dialect's change watcher, looking every ``interval`` seconds
        (every ``idle_interval`` while there is no news)."""
        return self.dialect.open_watcher(self.engine, interval, idle_interval=idle_interval)

    def detached(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` from outside the client's runtime (at interpreter exit)."""
        return fn()

    def close(self) -> None:
        """Close the connections of the pools beside the engine (at the client's
        shutdown; they open again on use)."""
        if self._autocommit_engine is not None:
            self._autocommit_engine.dispose()


def _first_line(exc: BaseException | None) -> str:
    """``Type: first line of the message`` of a driver's error."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _wrapped(exc: Exception, dialect: sa.Dialect) -> DBAPIError:
    """The driver's error ``exc`` as SQLAlchemy's (its kind of ``DBAPIError``)."""
    error = DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error, dialect=dialect)
    assert isinstance(error, DBAPIError)
    return error


#: What :meth:`SyncExecutor._deadline` gives without a timeout.
_UNBOUNDED = contextlib.nullcontext()


class _Bounded:
    """A block bounded by a deadline (:meth:`SyncExecutor.deadline`): a class,
    not a generator, as it runs around every transaction."""

    __slots__ = ("_cancel", "_conn", "_deadline", "_invalidate", "_timeout")

    def __init__(
        self,
        timeout: float,
        cancel: Callable[[Any], None],
        driver_conn: Any,
        invalidate: Callable[[], None],
    ) -> None:
        self._timeout = timeout
        self._cancel = cancel
        self._conn = driver_conn
        self._invalidate = invalidate

    def __enter__(self) -> None:
        self._deadline = _deadlines.watch(self._timeout, self._cancel, self._conn)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if not self._deadline.end():
            return
        if kind is not None and not issubclass(kind, Exception):
            return  # KeyboardInterrupt, a cancelled task: theirs to raise
        self._invalidate()
        raise _timed_out(self._timeout) from exc


def _timed_out(timeout: float) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the database did not answer within Options.transaction_timeout ({timeout:g} s): "
        "the transaction was cancelled and its connection closed; it may have committed "
        "(a publish with a dedup_key is safe to repeat)"
    )


def _on_driver(engine: sa.Engine, fn: Callable[[Link], T], executor: SyncExecutor) -> T:
    """``fn`` of a pooled DBAPI connection of ``engine`` (a
    :class:`~novaque.dialects.params.Driver`), its errors as SQLAlchemy's,
    within ``executor``'s deadline. ``fn``'s transaction is the dialect's; a
    DBAPI error is raised as SQLAlchemy's (``sqlalchemy.exc.DBAPIError`` and
    its kinds), and a lost connection is dropped from the pool, as on
    SQLAlchemy's own path."""
    fairy = executor.opened(engine.raw_connection)
    ended = False  # fn's transaction ended (it returned, or was rolled back here)
    try:
        dbapi: Any = fairy.dbapi_connection
        try:
            if executor.timeout is None:
                found = fn(Driver(dbapi))
            else:
                with executor.deadline(fairy.driver_connection, fairy.invalidate):
                    found = fn(Driver(dbapi))
            ended = True
            return found
        except engine.dialect.loaded_dbapi.Error as exc:
            lost = engine.dialect.is_disconnect(exc, dbapi, None)
            if lost:
                fairy.invalidate(exc)
            else:
                with contextlib.suppress(Exception):
                    dbapi.rollback()
                    ended = True
            raise DBAPIError.instance(
                None,
                None,
                exc,
                engine.dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=engine.dialect,
            ) from exc
    finally:
        # As SQLAlchemy's Connection does after its own commit: the pool need
        # not roll back what has ended (on PyMySQL that ROLLBACK is a round
        # trip of its own, on every publish of a plain engine).
        close_special = getattr(fairy, "_close_special", None)
        if ended and close_special is not None:
            close_special(transaction_reset=True)
        else:
            fairy.close()


class AsyncExecutor(SyncExecutor):
    """:class:`SyncExecutor` for an ``AsyncEngine``'s ``sync_engine``, run inside
    SQLAlchemy's greenlet bridge: its waits are awaited on the event loop.

    ``sqlite_on_loop`` (``Options.sqlite_on_loop``): on SQLite, run a
    transaction on the event loop's thread when the file's write lock is free
    (see :meth:`run`).
    """

    asynchronous = True

    def __init__(
        self,
        engine: sa.Engine,
        dialect: Dialect,
        *,
        timeout: float | None = None,
        sqlite_on_loop: bool = True,
    ) -> None:
        super().__init__(engine, dialect, timeout=timeout)
        #: SQLite: novaque's own transactions, run by a sync executor on a
        #: thread of the client's, or on the loop's (see :meth:`run`).
        self._threaded: SyncExecutor | None = None
        self._on_loop: _OnLoop | None = None
        self._thread: _Worker | None = None
        self._detached = False
        if dialect.one_writer:
            self._turn = _LoopTurn(engine.url.database or "")
            self._threaded = SyncExecutor(sync_sqlite_engine(engine), dialect)
            if sqlite_on_loop:
                self._on_loop = _OnLoop(
                    sync_sqlite_engine(engine, pool_size=1, busy_timeout_ms=0), dialect
                )

    def _run(self, fn: Callable[[Link], T], op: str, driver: bool, attempts: int) -> T:
        """:meth:`SyncExecutor.run`, awaited.

        On SQLite the whole transaction runs on a sync engine for the same
        file: SQLite is a library, not a server, so every asyncio driver for
        it (aiosqlite) runs each of its calls on a thread, about four hops
        per statement. The loop's tasks take their turn on the loop first.
        Then, when no other connection holds the file's write lock, the
        transaction runs right there on the loop's thread, a sync call of a
        few hundred microseconds (mostly the commit's disk sync) that costs no
        hop; SQLite is told not to wait for a lock there (``busy_timeout``
        0), so a lock held elsewhere sends the transaction to a thread of the
        client's, which waits and retries while the loop runs on. Without
        ``sqlite_on_loop`` every transaction takes that thread (one hop,
        60-250 µs here, about half of a one-message publish).
        """
        threaded = self._threaded
        if threaded is None:
            return super()._run(fn, op, driver, attempts)
        # The path is chosen for the application's engine, whose events the
        # driver path would skip, not for the sync engine that runs it.
        return self._on_sqlite(lambda executor: executor._run(fn, op, driver, attempts))

    def _on_sqlite(self, use: Callable[[SyncExecutor], T]) -> T:
        """SQLite: ``use`` of a sync executor, on the loop's thread if the write
        lock is free, else on the client's thread, awaited in the loop's turn
        (at exit, with no loop: here)."""
        threaded = self._threaded
        assert threaded is not None
        if self._detached:
            return use(threaded)
        with self._turn:
            if self._on_loop is not None:
                try:
                    return use(self._on_loop)
                except _LockTaken:
                    pass
            return await_only(self._on_thread(functools.partial(use, threaded)))

    def without_transaction(self, fn: Callable[[sa.Connection], T]) -> T:
        """:meth:`SyncExecutor.without_transaction`, awaited: on SQLite on a
        thread of the client's, on the sync engine its transactions use (a
        ``VACUUM`` may take a while: the loop runs on meanwhile)."""
        threaded = self._threaded
        if threaded is None:
            return super().without_transaction(fn)
        with self._turn:
            return await_only(self._on_thread(functools.partial(threaded.without_transaction, fn)))

    async def _on_thread(self, call: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = _Worker("novaque-sqlite")
        return await self._thread.submit(call)

    def close(self) -> None:
        super().close()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        for executor in (self._threaded, self._on_loop):
            if executor is not None:
                executor.engine.dispose()

    def pause(self, seconds: float) -> None:
        await_only(asyncio.sleep(seconds))

    def mutex(self) -> contextlib.AbstractContextManager[object]:
        return _AwaitedLock()

    def open_listener(self) -> NotifyListener | None:
        return self.dialect.open_listener(self.engine, awaited=True)

    def open_watcher(self, interval: float, idle_interval: float | None = None) -> NotifyListener:
        """On SQLite the sync watcher, run on a thread of its own (every look
        through aiosqlite would be about four thread hops, every few
        milliseconds): the loop only awaits what a wait found. Elsewhere the
        dialect's watcher, its statements and pauses awaited on the loop."""
        threaded = self._threaded
        if threaded is None:
            return self.dialect.open_watcher(
                self.engine, interval, idle_interval=idle_interval, awaited=True
            )
        return _ThreadedListener(functools.partial(threaded.open_watcher, interval, idle_interval))

    def detached(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on an event loop of its own, once the application's loop is
        gone (at exit): the pooled connections of that loop are forgotten, not
        closed (they belong to it), and the ones opened here are closed after."""
        if running_loop() is not None:
            raise RuntimeError("an event loop is running in this thread")
        pools = [e for e in (self.engine, self._autocommit_engine) if e is not None]
        for pool in pools:
            pool.dispose(close=False)
        self._detached = True  # SQLite's transactions in this thread (its pool is gone)

        async def run() -> T:
            try:
                return await greenlet_spawn(fn)
            finally:
                for pool in pools:
                    await greenlet_spawn(pool.dispose)

        try:
            return asyncio.run(run())
        finally:
            self._detached = False


class _LockTaken(Exception):
    """SQLite's write lock is held elsewhere: the transaction goes to the thread."""


class _OnLoop(SyncExecutor):
    """Runs SQLite transactions on the event loop's thread, but never waits for a
    lock there: its connections do not wait in SQLite's busy handler
    (``busy_timeout`` 0), and the process's turn on the file is only tried.
    A lock held elsewhere raises :class:`_LockTaken` before anything was
    committed (a transaction that met it was rolled back), for the caller to
    run the transaction where waiting is harmless."""

    def __init__(self, engine: sa.Engine, dialect: Dialect) -> None:
        super().__init__(engine, dialect)
        self._lock = _write_lock(engine)

    def _retried(self, attempt_once: Callable[[], T], attempts: int) -> T:
        if not self._lock.acquire(blocking=False):
            raise _LockTaken
        try:
            return attempt_once()
        except DBAPIError as exc:
            if self.dialect.is_retryable(exc):
                raise _LockTaken from exc
            self.raise_unavailable(exc)
            raise
        finally:
            self._lock.release()


class _Worker:
    """One thread that runs calls for event loops, one at a time.

    What ``loop.run_in_executor`` with a one-thread pool does, with half its
    cost per call (about 40 µs instead of 90 here): a ``SimpleQueue`` in, the
    result handed back with ``call_soon_threadsafe``, and no
    ``concurrent.futures.Future`` chained to an asyncio one in between. A call
    whose awaiting task was cancelled still runs to its end (a transaction is
    never cut in half); its result is dropped. The thread is a daemon: at
    interpreter exit a transaction it had not finished is rolled back by the
    database, as after any crash.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]] | None
        ] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, call))
        return future

    def stop(self) -> None:
        """Let the thread end once the calls queued before have run."""
        self._calls.put(None)

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            loop, future, call = item
            try:
                result = call()
            except BaseException as exc:
                _hand_back(loop, future, None, exc)
            else:
                _hand_back(loop, future, result, None)


class _ThreadedListener:
    """A sync listener whose every call runs on a thread of its own, awaited.

    Its waits block that thread only; :meth:`interrupt` goes straight to the
    listener (it only writes to a socket), so a wait ends at once.
    """

    def __init__(self, open_: Callable[[], NotifyListener]) -> None:
        self._worker = _Worker("novaque-watcher")
        try:
            self._listener: NotifyListener = await_only(self._worker.submit(open_))
        except BaseException:
            self._worker.stop()
            raise

    def wait(self, timeout: float) -> list[str]:
        call = functools.partial(self._listener.wait, timeout)
        return await_only(self._worker.submit(call))

    def interrupt(self) -> None:
        self._listener.interrupt()

    def hurry(self) -> None:
        self._listener.hurry()  # it only writes to a socket, as interrupt does

    def close(self) -> None:
        self._listener.interrupt()  # a wait still running ends first
        try:
            await_only(self._worker.submit(self._listener.close))
        except BaseException:
            self._listener.close()  # not awaitable now (cancelled, no loop): from here
            raise
        finally:
            self._worker.stop()


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.cancelled():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    # A loop closed meanwhile raises RuntimeError: nobody waits for the result.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)


class _AwaitedLock:
    """An ``asyncio.Lock`` used as a plain ``with`` block from inside the bridge."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def __enter__(self) -> None:
        await_only(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Turn:
    """Whose turn it is, for the tasks of one event loop on one SQLite file."""

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        #: Tasks waiting, first come first served: each is handed the turn.
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on, still held
                return
        self.held = False


#: SQLite's turn for tasks: one per file and event loop.
_loop_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Turn]] = (
    weakref.WeakKeyDictionary()
)


class _LoopTurn:
    """The tasks of one event loop take turns on a SQLite file, like threads do.

    A thread's lock would not do: tasks share their thread, so a reentrant lock
    lets them all in, and a plain one blocks the loop for good. A free turn is
    taken without awaiting anything (an ``asyncio.Lock`` would be awaited,
    two switches of the greenlet bridge on every transaction); a task that
    finds it taken awaits its turn, first come first served.
    """

    def __init__(self, database: str) -> None:
        self._database = database
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._turn = _Turn()

    def _current(self) -> _Turn:
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop() is not loop:
            turns = _loop_turns.setdefault(loop, {})
            self._turn = turns.setdefault(self._database, _Turn())
            self._loop = weakref.ref(loop)
        return self._turn

    def __enter__(self) -> None:
        turn = self._current()
        if not turn.held:
            turn.held = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn.waiters.append(waiter)
        try:
            await_only(waiter)
        except BaseException:
            if not waiter.done():
                turn.waiters.remove(waiter)
            elif not waiter.cancelled():
                turn.release()  # handed the turn, but leaving: pass it on
            raise

    def __exit__(self, *exc: object) -> None:
        self._turn.release()
