"""Publishing: :meth:`Publishing.publish` and :meth:`Publishing.publish_many`,
with what they keep between calls (the topic ids learned are the context's;
here the topics last seen with routed channels, the driver path's plan of each
topic, the filters of each topic's channels) and the callbacks that wait for
the commit of a caller's transaction (:func:`take_after_commit`).

A part of :class:`novaque.Client` (over its :class:`~novaque._context.Context`),
which forwards its ``publish`` and ``publish_many`` here.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from novaque import _hooks, _migrate, _validate, dialects
from novaque._context import Context
from novaque.errors import InvalidOption, TopicGone
from novaque.ops import publish as publish_op
from novaque.options import Duration, microseconds

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["EVALUATION_TRIES", "Publishing", "after_commit", "take_after_commit"]

#: How often a publish of novaque's own is tried with its filters evaluated
#: before its transaction when they change meanwhile (see
#: Publishing._publish_evaluated); the try after evaluates them in it.
EVALUATION_TRIES = 3


def _groups_of(params: dict[str, Any]) -> list[str | None]:
    """The groups of a publish's messages (``params`` as _write_messages makes them)."""
    groups: list[str | None] = params["groups"] or [None]
    return groups


class Publishing:
    """Publishing to topics, over a client's context (see the module docstring)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self.options = context.options
        #: Engines of callers' connections whose schema was checked.
        self._checked_engines: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
        #: Topics last seen with routed channels: published in a transaction
        #: (a hint only: each publish learns the truth in its own statements).
        self._routed_topics: set[str] = set()
        #: The driver path's plan of each topic, from its last publish there
        #: (checked by the database, so a stale one costs time, not deliveries).
        self._plans: dict[str, str] = {}
        #: The filters of each topic's channels as its last publish read them,
        #: evaluated before the next one's transaction (a hint: the
        #: transaction reads them again, see _publish_evaluated).
        self._topic_filters: dict[str, frozenset[str]] = {}

    def forget_all(self) -> None:
        """Drop what was learned of the topics (the schema was downgraded)."""
        self._plans.clear()

    def publish(
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
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> int:
        """Publish one message to ``topic``; return its id.

        One delivery is written for each channel the topic has, in the same
        transaction as the message. With ``connection`` or ``session`` the
        message joins that transaction (and commits or rolls back with it);
        otherwise novaque commits it before returning. A topic that does not
        exist is created. With ``dedup_key``, publishing again with the same
        key while the first message lives (until its TTL purge or
        :meth:`prune`) returns the first id and writes nothing when the body,
        headers and group are the same (headers of a trace context,
        ``traceparent``, ``tracestate`` and ``baggage``, are not compared: a
        publish retried from another trace is the same message); when one
        differs it raises
        :class:`~novaque.DedupConflict` (with the key and the first id) and
        writes nothing. ``group`` (1-200 characters) is the message's ordering key:
        a ``group_fifo`` channel hands out the messages of one group one at a
        time, in order (see docs/how-to/ordering.md). ``priority`` (an int
        from -100 to 100) orders the due deliveries of each channel: lower
        first, then oldest due first (see docs/how-to/priorities.md).
        """
        return self._publish(
            topic,
            [body],
            batch=False,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=[_validate.dedup_key(dedup_key)],
            groups=[_validate.group(group)],
            priority=_validate.priority(priority),
            connection=connection,
            session=session,
        )[0]

    def publish_many(
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
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> list[int]:
        """Publish many messages to ``topic`` in one transaction with bulk inserts.

        Returns their ids in order. ``delay``, ``ttl``, ``max_attempts``,
        ``headers`` and ``priority`` apply to every message; ``dedup_keys`` and ``groups``, if
        given, have one key (or None) per body.

        A body whose dedup key is held by a live message returns that
        message's id (as :meth:`publish`); if one such holder has another
        body, headers or group, :class:`~novaque.DedupConflict` is raised and
        the whole call writes nothing, also in a caller's transaction
        (``connection``/``session``), which may go on. A key given twice in
        one call must come with the same body and group (else
        :class:`~novaque.InvalidOption`, before any statement): the second
        gets the first one's id.
        """
        body_list = list(bodies)
        checked_priority = _validate.priority(priority)
        if dedup_keys is None:
            keys: list[str | None] = [None] * len(body_list)
        else:
            keys = [_validate.dedup_key(k) for k in dedup_keys]
            if len(keys) != len(body_list):
                raise InvalidOption(
                    f"dedup_keys has {len(keys)} entries for {len(body_list)} bodies"
                )
        if groups is None:
            group_list: list[str | None] = [None] * len(body_list)
        else:
            if isinstance(groups, str):
                raise TypeError("groups must be a sequence of str or None, one per body")
            group_list = [_validate.group(g) for g in groups]
            if len(group_list) != len(body_list):
                raise InvalidOption(
                    f"groups has {len(group_list)} entries for {len(body_list)} bodies"
                )
        return self._publish(
            topic,
            body_list,
            batch=True,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=keys,
            groups=group_list,
            priority=checked_priority,
            connection=connection,
            session=session,
        )

    def _publish(
        self,
        topic: str,
        bodies: list[bytes | str],
        *,
        batch: bool,
        delay: Duration | None,
        ttl: Duration | None,
        max_attempts: int | None,
        headers: Mapping[str, str] | None,
        dedup_keys: list[str | None],
        groups: list[str | None],
        priority: int,
        connection: sa.Connection | None,
        session: Session | None,
    ) -> list[int]:
        """Publish through the instrumentation's hook if one is installed
        (:mod:`novaque._hooks`: a ``publish`` span around the write, its trace
        context added to the headers), else directly."""
        _validate.name(topic, "topic")
        hook = _hooks.publish
        if hook is None or not bodies:
            return self._write_messages(
                topic,
                bodies,
                headers,
                delay=delay,
                ttl=ttl,
                max_attempts=max_attempts,
                dedup_keys=dedup_keys,
                groups=groups,
                priority=priority,
                connection=connection,
                session=session,
            )
        # A partial, not a closure: the path without a hook creates no cells.
        write = functools.partial(
            self._write_messages,
            topic,
            bodies,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            dedup_keys=dedup_keys,
            groups=groups,
            priority=priority,
            connection=connection,
            session=session,
        )
        return hook(topic, len(bodies), batch, headers, write)

    def _write_messages(
        self,
        topic: str,
        bodies: list[bytes | str],
        headers: Mapping[str, str] | None,
        *,
        delay: Duration | None,
        ttl: Duration | None,
        max_attempts: int | None,
        dedup_keys: list[str | None],
        groups: list[str | None],
        priority: int,
        connection: sa.Connection | None,
        session: Session | None,
    ) -> list[int]:
        data = [_validate.body(b, self.options.max_body_bytes) for b in bodies]
        ttl_s = _validate.ttl(ttl, self._context.default_ttl)
        delay_s = _validate.delay(delay, ttl_s)
        attempts = _validate.max_attempts(max_attempts, self.options.default_max_attempts)
        header_text = _validate.headers(headers)
        _check_repeated_keys(dedup_keys, data, groups)
        if connection is not None and session is not None:
            raise InvalidOption("pass either connection or session to publish, not both")
        if connection is not None and not isinstance(connection, sa.Connection):
            raise TypeError(
                "connection must be a SQLAlchemy Connection, got "
                f"{type(connection).__name__}{_validate.async_hint(connection)}"
            )
        if session is not None and not _is_session(session):
            raise TypeError(
                "session must be a SQLAlchemy Session, got "
                f"{type(session).__name__}{_validate.async_hint(session)}"
            )
        if not data:
            return []
        params: dict[str, Any] = {
            "topic": topic,
            "bodies": data,
            "dedup_keys": dedup_keys,
            "groups": groups,
            "headers": header_text,
            "ttl_us": microseconds(ttl_s),
            "delay_us": microseconds(delay_s),
            "max_attempts": attempts,
            "priority": priority,
        }
        if session is not None:
            connection = session.connection()
        if connection is not None:
            # The caller's transaction: the topic id is read in it (never
            # taken from the cache, which may hold an id of another database
            # or one deleted since), so it commits or rolls back with it.
            ours = self._context.is_ours(connection)
            if ours:
                self._context.ready()
            else:
                self._ready_elsewhere(connection)
            # The topic's filters known here evaluated before the publish writes
            # (on SQLite, before the caller's transaction may take the write
            # lock); those met in it that were not are evaluated there.
            verdicts = self._verdicts(topic, params) if ours else None
            done = publish_op.publish(
                connection,
                self._context.dialect,
                self._context.now(),
                topic_id=None,
                verdicts=verdicts,
                **params,
            )
            if ours:
                self._learn_filters(topic, done)
                # Not cached: the id is the caller's transaction's until it commits.
                effects = dataclasses.replace(done.effects(topic), topic_ids=())
                after_commit(connection, lambda: self._context.apply(effects))
            else:
                # Another database: its counters are written there, in the
                # caller's transaction (this client's buffer is for its own).
                publish_op.count_here(connection, self._context.dialect, done)
            return done.ids
        return self._run_publish(topic, params)

    def _run_publish(self, topic: str, params: dict[str, Any]) -> list[int]:
        """Publish in novaque's own transaction; the topic id is cached once it committed."""
        topic_id = self._context.topic_ids.get(topic)
        # One statement where the dialect can: the topic id is known, no dedup
        # keys, the bodies fit one INSERT batch, and the topic was not seen
        # with routed channels (a filter, an ordering), whose deliveries are
        # written by a second statement of the same transaction; and priority
        # 0 (the columns' default: another priority is written by a second
        # statement too).
        one = (
            topic_id is not None
            and not params["priority"]
            and topic not in self._routed_topics
            and publish_op.one_statement(params["bodies"], params["dedup_keys"])
        )
        try:
            # One message without a group: the dialect may write it in the
            # driver's SQL (the executor's choice), with the topic's plan.
            single = len(params["bodies"]) == 1 and params["groups"][0] is None
            op = ("publish_one" if single else "publish") if one else ""
            done = self._publish_evaluated(
                op, topic, params, topic_id=topic_id, routed=not one, plan=self._plans.get(topic)
            )
            if done.plan is not None:
                self._plans[topic] = done.plan
            if done.declined:  # routed channels after all: nothing was written
                self._routed_topics.add(topic)
                done = self._publish_evaluated("", topic, params, topic_id=topic_id)
        except (sa.exc.IntegrityError, TopicGone):
            # A cached topic id may belong to a topic deleted elsewhere (ids are
            # never reused, so it cannot name another topic): look it up again.
            if self._context.topic_ids.pop(topic, None) is None:
                raise
            done = self._publish_evaluated("", topic, params, topic_id=None)
        if not done.routed:
            self._routed_topics.discard(topic)
            self._topic_filters.pop(topic, None)
        self._context.apply(done.effects(topic))
        return done.ids

    def _publish_evaluated(
        self, op: str, topic: str, params: dict[str, Any], **how: Any
    ) -> publish_op.Published:
        """:func:`novaque.ops.publish.publish` of ``params`` in novaque's own
        transaction (``op``: as for :meth:`Context.run`; ``how``: its ``topic_id`` and
        ``routed``), the topic's filters evaluated before the transaction
        begins: evaluated in it, they would hold its locks meanwhile (on SQLite
        the database's write lock, which every other writer waits for).

        The filters evaluated are those the topic's last publish read. The
        transaction reads the channels again and finds each verdict by the
        filter's text; one it lacks (a filter set or changed since) rolls it
        back (:class:`~novaque.ops.publish.Unevaluated`), to be evaluated and
        published again. Should the filters change at every try, the last
        evaluates them in the transaction."""
        # No filter known: nothing to evaluate first (a common publish's case).
        verdicts = self._verdicts(topic, params) if topic in self._topic_filters else {}
        for _ in range(EVALUATION_TRIES):
            try:
                done = self._context.run_timed(
                    op, publish_op.publish, verdicts=verdicts, evaluate_here=False, **how, **params
                )
            except publish_op.Unevaluated as met:
                self._topic_filters[topic] = met.filters
                self._verdicts(topic, params, verdicts)
                continue
            self._learn_filters(topic, done)
            return done
        done = self._context.run_timed(op, publish_op.publish, verdicts=verdicts, **how, **params)
        self._learn_filters(topic, done)
        return done

    def _verdicts(
        self, topic: str, params: dict[str, Any], verdicts: publish_op.Verdicts | None = None
    ) -> publish_op.Verdicts:
        """``verdicts`` (a new dict if None) with those it lacks of the filters
        last read for ``topic`` (none if it has none) on the messages of
        ``params``."""
        filters = self._topic_filters.get(topic, ())
        return publish_op.evaluate(filters, params["headers"], _groups_of(params), topic, verdicts)

    def _learn_filters(self, topic: str, done: publish_op.Published) -> None:
        """Keep the filters a publish read of ``topic``'s channels, if it read them."""
        if done.filters:
            self._topic_filters[topic] = done.filters
        elif done.filters is not None:
            self._topic_filters.pop(topic, None)

    def _ready_elsewhere(self, conn: sa.Connection) -> None:
        """The checks for a caller's connection to another database (once per engine)."""
        if conn.engine in self._checked_engines:
            return
        if dialects.class_for(conn) is not type(self._context.dialect):
            raise InvalidOption(
                f"this client works with {self._context.dialect.name}; the connection given to "
                f"publish is to {conn.dialect.name}: use a client of that database"
            )
        # On a connection of its own: a failed query must not break the
        # caller's transaction.
        with conn.engine.connect() as probe:
            _migrate.require_current(probe)
        self._checked_engines.add(conn.engine)


def _is_session(obj: object) -> bool:
    """Whether ``obj`` is a SQLAlchemy ORM session (or scoped session), without
    importing the ORM: an application that holds a session has imported it."""
    if "sqlalchemy.orm" not in sys.modules:
        return False
    from sqlalchemy.orm import Session, scoped_session

    return isinstance(obj, (Session, scoped_session))


def _check_repeated_keys(
    keys: Sequence[str | None], bodies: Sequence[bytes], groups: Sequence[str | None]
) -> None:
    """A dedup key given twice in one call must name one message: the same body
    and group (the headers are the call's), else :class:`~novaque.InvalidOption`."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        j = first.setdefault(key, i)
        if j != i and (bodies[j] != bodies[i] or groups[j] != groups[i]):
            raise InvalidOption(
                f"dedup_keys gives {key!r} to bodies {j} and {i} with a different "
                "body or group: one key names one message (give each its own key)"
            )


# -- running code when the caller's transaction commits --------------------------------

_pending_lock = threading.Lock()
#: Per connection: the callbacks waiting for its commit, each with the names of
#: the savepoints open when it was registered.
_pending: weakref.WeakKeyDictionary[
    sa.Connection, list[tuple[frozenset[str], Callable[[], None]]]
] = weakref.WeakKeyDictionary()


def after_commit(conn: sa.Connection, callback: Callable[[], None]) -> None:
    """Run ``callback`` once the transaction of ``conn`` commits; drop it on a
    rollback, and on the rollback of a savepoint that was open when it was added."""
    inside = _open_savepoints(conn)
    with _pending_lock:
        queue = _pending.get(conn)
        if queue is None:
            queue = _pending[conn] = []
            sa.event.listen(conn, "commit", _run_pending)
            sa.event.listen(conn, "rollback", _drop_pending)
            sa.event.listen(conn, "rollback_savepoint", _drop_savepoint)
        queue.append((inside, callback))


def _open_savepoints(conn: sa.Connection) -> frozenset[str]:
    names: set[str] = set()
    nested: Any = conn.get_nested_transaction()
    while nested is not None:
        names.add(nested._savepoint)
        nested = nested._previous_nested
    return frozenset(names)


def _run_pending(conn: sa.Connection) -> None:
    with _pending_lock:
        callbacks = _pending.get(conn, [])
        _pending[conn] = []
    for _, callback in callbacks:
        callback()


def take_after_commit(conn: sa.Connection) -> list[Callable[[], None]]:
    """Take the callbacks waiting for the commit of ``conn`` away from it: for a
    connection committed by someone SQLAlchemy does not see (Django's), who
    runs them at that commit instead."""
    with _pending_lock:
        waiting = _pending.pop(conn, [])
    return [callback for _, callback in waiting]


def _drop_pending(conn: sa.Connection) -> None:
    with _pending_lock:
        _pending[conn] = []


def _drop_savepoint(conn: sa.Connection, name: str, context: object) -> None:
    with _pending_lock:
        _pending[conn] = [entry for entry in _pending.get(conn, []) if name not in entry[0]]
