"""novaque as a kombu transport: Celery (or any kombu application) with its
broker in the application's database.

Two lines::

    import novaque.kombu  # registers the transport name "novaque"

    app = Celery("tasks", broker="novaque+postgresql+psycopg://app:secret@db/app")

``novaque+`` is followed by any SQLAlchemy URL novaque supports (PostgreSQL,
MySQL/MariaDB, SQLite), as kombu's own ``sqla+`` transport takes it.

How kombu's model maps onto novaque's (docs/how-to/celery.md says the same
for users):

- A kombu **queue** is a novaque **channel** (named after the queue). Every
  queue has a *home topic*, ``kombu::<queue>``: AMQP's default exchange, where
  a message published with no exchange and the queue's name as routing key
  lands. Celery publishes its tasks that way.
- An **exchange** is one or more **topics**, and a **binding** is the queue's
  channel on one of them: a *direct* exchange has a topic per routing key
  (``kombu::<exchange>::direct::<key>``), so a publish reaches exactly the
  queues bound with that key through novaque's own fan-out; a *fanout*
  exchange is one topic (``kombu::<exchange>::fanout``) whose channels are the
  bound queues; a *topic* exchange has a topic per binding pattern
  (``kombu::<exchange>::topic::<pattern>``), and the publisher matches the
  routing key against the patterns with kombu's own ``TopicExchange`` (the
  patterns are the topic names, read from the database, so they are shared
  by every process). Bindings live in the database: a producer routes to
  queues that only a consumer in another process declared.
- Consuming a queue claims from its home topic and from the topic of each
  of its bindings, whichever process declared them: the bindings are read
  from the database (and read again after :attr:`Transport.topics_ttl`),
  and deleting a queue deletes its channel on each of them.
- A message handed to kombu unacked is a **lease**, renewed in the
  background while it is held (a running task, or one Celery keeps until its
  ETA), acked by ``basic_ack``, requeued at once by
  ``basic_reject(requeue=True)``, dead-lettered by
  ``basic_reject(requeue=False)`` and given back without counting an attempt
  when the channel closes. A consumer that dies holding a lease has its
  messages delivered again once the lease runs out (``lease``, 30 s by
  default), so with ``task_acks_late`` a task of a killed worker runs again.
- A message whose Celery ``eta`` header (``countdown``, ``eta``, retries with
  a countdown) lies in the future is published with a novaque ``delay``: it
  waits in the database, not leased by a worker. ``expiration`` (AMQP's
  per-message TTL, in ms) becomes the message's TTL.

Not supported, as with kombu's SQLAlchemy transport: priorities, the
``headers`` exchange, ``deadletter_queue`` for unroutable messages (a message
no queue is bound for is kept without deliveries, browsable, and logged).

Transport options (``broker_transport_options`` in Celery): ``lease``
(seconds, default 30), ``max_attempts`` (deliveries of one message before it
is dead, default the client's 5; a lease that ran out counts), ``ttl``
(seconds, default the client's 7 days), ``claim_batch`` (most messages one
claim takes, within the prefetch count; default 10), ``polling_interval``
(seconds between polls of empty queues, default 0.2), ``topic_prefix``
(default ``"kombu"``), ``migrate`` (apply novaque's migrations when the first
connection opens, default ``True``) and ``options`` (a dict of
:class:`novaque.Options` fields for :func:`novaque.connect`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from hashlib import sha256
from queue import Empty
from typing import Any

import sqlalchemy as sa
from kombu.transport import TRANSPORT_ALIASES, virtual

import novaque
from novaque._core import parts_of
from novaque.errors import ChannelNotFound, LeaseLost, TopicNotFound

__all__ = ["Channel", "QoS", "Transport", "channel_name", "shutdown_clients", "topic_names"]

TRANSPORT_ALIASES["novaque"] = "novaque.kombu:Transport"

log = logging.getLogger("novaque.kombu")

#: Characters kept as they are in names; any other is written ``:hh`` per UTF-8 byte.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
#: Longest novaque name.
_NAME_MAX = 200
#: Most seconds a delay may have in novaque (90 days); a later ETA is left to the worker.
_MAX_DELAY_S = 90 * 86_400.0


def _encode(name: str) -> str:
    """``name`` in novaque's name alphabet: injective, and never containing ``::``."""
    return "".join(
        c if c in _PLAIN else "".join(f":{b:02x}" for b in c.encode("utf-8", "surrogatepass"))
        for c in name
    )


def _decode(text: str) -> str:
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == ":":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out += text[i].encode()
            i += 1
    return out.decode("utf-8", "surrogatepass")


def _fit(name: str) -> str:
    """A name cut to novaque's limit, with a digest of the whole so cut names stay apart."""
    if len(name) <= _NAME_MAX:
        return name
    return f"{name[:157]}::{sha256(name.encode()).hexdigest()[:41]}"


def channel_name(queue: str) -> str:
    """The novaque channel that holds the kombu queue ``queue``."""
    return _fit(_encode(queue))


def topic_names(prefix: str, exchange: str, kind: str, key: str = "") -> str:
    """The novaque topic of a binding: ``exchange`` ``""`` is the default exchange
    (``key`` is then the queue), ``kind`` the exchange type."""
    if not exchange:
        return _fit(f"{prefix}::{_encode(key)}")
    head = f"{prefix}::{_encode(exchange)}::{kind}"
    if kind == "fanout":
        return _fit(head)
    name = f"{head}::{_encode(key)}"
    if kind == "topic" and len(name) > _NAME_MAX:
        # The pattern is read back from the name: it cannot be cut.
        raise ValueError(f"binding pattern {key!r} of exchange {exchange!r} is too long")
    return _fit(name)


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class _Held:
    """A claimed delivery not settled yet, and when its lease was last extended."""

    __slots__ = ("msg", "renewed")

    def __init__(self, msg: novaque.Message) -> None:
        self.msg = msg
        self.renewed = time.monotonic()


class QoS(virtual.QoS):
    """Unacked messages are novaque leases: settling one settles the lease."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.channel._settle(delivery_tag, "ack")
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel._settle(delivery_tag, "requeue" if requeue else "reject")
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        """Give every unacked message back (channel closed, ``basic_recover``)."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        self.channel._give_back(tags)
        return []


class Channel(virtual.Channel):
    """One kombu channel on a novaque client (shared by the process's channels)."""

    QoS = QoS
    supports_fanout = True
    from_transport_options: tuple[str, ...] = (  # type: ignore[assignment]
        *virtual.Channel.from_transport_options,
        "lease",
        "max_attempts",
        "ttl",
        "claim_batch",
        "topic_prefix",
    )
    lease: float = 30.0
    max_attempts: int | None = None
    ttl: float | None = None
    claim_batch: int = 10
    topic_prefix: str = "kombu"

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.lease = float(self.lease)
        self.client = connection.novaque_client()
        self._lock = threading.Lock()
        #: Claimed and not settled, by delivery tag (buffered or handed to kombu).
        self._held: dict[str, _Held] = {}
        #: Claimed for a queue and not yet handed to kombu.
        self._buffer: dict[str, deque[dict[str, Any]]] = {}
        #: Per queue, the topic to claim from first (the last that had messages).
        self._first: dict[str, int] = {}
        self._no_ack: set[str] = set()
        self._auto_delete: set[str] = set()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -- names ----------------------------------------------------------------------

    def _home(self, queue: str) -> str:
        return topic_names(self.topic_prefix, "", "direct", queue)

    def _binding_topic(self, exchange: str, routing_key: str) -> str:
        return topic_names(self.topic_prefix, exchange, self.typeof(exchange).type, routing_key)

    def _topics_of(self, queue: str) -> list[str]:
        """The topics ``queue`` is consumed from: its home, then the topic of
        each of its bindings, whichever process declared them (read from the
        database, see :meth:`Transport.topology`)."""
        home = self._home(queue)
        bound = self.connection.topology(self.client, self.topic_prefix).bindings
        return [home, *(t for t in bound.get(channel_name(queue), ()) if t != home)]

    # -- topology -------------------------------------------------------------------

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.client.ensure_channel(self._home(queue), channel_name(queue))
        if kwargs.get("auto_delete"):
            self._auto_delete.add(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            return channel_name(queue) in self.client.list_channels(self._home(queue))
        except TopicNotFound:
            return False

    def _queue_bind(self, exchange: str, routing_key: str, pattern: Any, queue: str) -> None:
        self.client.ensure_channel(self._binding_topic(exchange, routing_key), channel_name(queue))
        self.connection.forget_topology()  # routed by and consumed from at once, in this process

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        if exchange:
            self._drop(self._binding_topic(exchange, routing_key), queue)
            self.connection.forget_topology()

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Delete the queue's channel on its home and on every topic it is bound
        to, whichever process bound it."""
        if if_empty and self._size(queue):
            return
        self.connection.forget_topology()
        for topic in self._topics_of(queue):
            self._drop(topic, queue)
        self.state.queue_bindings_delete(queue)
        self.connection.forget_topology()
        self._auto_delete.discard(queue)
        with self._lock:
            buffered = self._buffer.pop(queue, deque())
            for payload in buffered:
                self._held.pop(payload["properties"]["delivery_tag"], None)

    def _drop(self, topic: str, queue: str) -> None:
        """Delete a queue's channel on ``topic``, and the topic when it has no channel left."""
        try:
            self.client.delete_channel(topic, channel_name(queue))
            if not self.client.list_channels(topic):
                self.client.delete_topic(topic)
        except (TopicNotFound, ChannelNotFound):
            pass

    def _size(self, queue: str) -> int:
        ready = 0
        for topic in self._topics_of(queue):
            with contextlib.suppress(TopicNotFound, ChannelNotFound):
                ready += self.client.channel_backlog(topic, channel_name(queue)).ready
        return ready

    def _purge(self, queue: str) -> int:
        """Remove the queue's ready messages (not those leased or waiting for a delay)."""
        purged = 0
        for topic in self._topics_of(queue):
            while True:
                try:
                    got = self.client.claim(
                        topic, channel_name(queue), max_messages=1000, lease=self.lease
                    )
                except (TopicNotFound, ChannelNotFound):
                    break
                if not got:
                    break
                purged += len(got) - len(self.client.ack_many(got))
        return purged

    # -- publishing -----------------------------------------------------------------

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> None:
        """Publish to the topics kombu's exchange type routes ``routing_key`` to."""
        self._inplace_augment_message(message, exchange, routing_key)
        for topic in self._route(exchange, routing_key):
            self._publish(topic, message)

    def _route(self, exchange: str, routing_key: str) -> list[str]:
        if not exchange:
            return [self._home(routing_key)]
        kind = self.typeof(exchange).type
        if kind != "topic":
            return [self._binding_topic(exchange, routing_key)]
        head = topic_names(self.topic_prefix, exchange, "topic", "")
        matcher: Any = self.exchange_types["topic"]
        table = [
            (pattern, matcher.key_to_pattern(pattern), topic)
            for topic in self.connection.topology(self.client, self.topic_prefix).topics
            if topic.startswith(head)
            for pattern in [_decode(topic[len(head) :])]
        ]
        return sorted(matcher.lookup(table, exchange, routing_key, None))

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._publish(self._home(queue), message)

    def _publish(self, topic: str, message: dict[str, Any]) -> None:
        ttl = self.ttl
        expiration = message.get("properties", {}).get("expiration")
        if expiration is not None:
            ttl = max(float(expiration) / 1000.0, 0.001)
        if ttl is None:
            ttl = _seconds(self.client.options.default_ttl)
        delay = _eta_delay(message.get("headers") or {})
        if delay is not None:
            ttl += delay  # the message lives its TTL from when it is due
        self.client.publish(
            topic,
            json.dumps(message).encode(),
            delay=delay,
            ttl=ttl,
            max_attempts=self.max_attempts,
            priority=_priority(message.get("properties", {}).get("priority")),
        )

    # -- consuming ------------------------------------------------------------------

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> None:
        if no_ack:
            self._no_ack.add(queue)
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        self.connection.start_maintenance(self.client)

    def basic_cancel(self, consumer_tag: str) -> None:
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack.discard(queue)
            with self._lock:
                tags = [p["properties"]["delivery_tag"] for p in self._buffer.pop(queue, ())]
            self._give_back(tags)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        try:
            payload = self._get(queue, no_ack=no_ack)
        except Empty:
            return None
        message = self.Message(payload, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None, no_ack: bool | None = None) -> Any:
        """The next message of ``queue``: from the buffer, else from a claim."""
        settle_now = queue in self._no_ack if no_ack is None else no_ack
        with self._lock:
            buffered = self._buffer.get(queue)
            if buffered:
                payload = buffered.popleft()
                if settle_now:
                    held = self._held.pop(payload["properties"]["delivery_tag"], None)
                    if held is not None:
                        self._ack_quietly([held.msg])
                return payload
        payloads = self._claim(queue, settle_now)
        if not payloads:
            raise Empty()
        first = payloads.pop(0)
        if payloads:
            with self._lock:
                self._buffer.setdefault(queue, deque()).extend(payloads)
        return first

    def _claim(self, queue: str, settle_now: bool) -> list[dict[str, Any]]:
        limit = 1 if settle_now else self._claim_limit()
        topics = self._topics_of(queue)
        start = self._first.get(queue, 0) % len(topics)
        for i in range(len(topics)):
            topic = topics[(start + i) % len(topics)]
            try:
                got = self.client.claim(
                    topic, channel_name(queue), max_messages=limit, lease=self.lease
                )
            except (TopicNotFound, ChannelNotFound):
                continue
            if got:
                self._first[queue] = (start + i) % len(topics)
                break
        else:
            return []
        payloads = [_payload(msg) for msg in got]
        if settle_now:
            self._ack_quietly(got)
            return payloads
        with self._lock:
            for payload, msg in zip(payloads, got, strict=False):
                self._held[payload["properties"]["delivery_tag"]] = _Held(msg)
        self._start_heartbeat()
        return payloads

    def _claim_limit(self) -> int:
        estimate = self.qos.can_consume_max_estimate()
        if estimate is None:
            return max(1, int(self.claim_batch))
        room = int(estimate)
        with self._lock:
            buffered = sum(len(b) for b in self._buffer.values())
        return max(1, min(int(self.claim_batch), room - buffered))

    # -- settling -------------------------------------------------------------------

    def _settle(self, delivery_tag: str, how: str) -> None:
        with self._lock:
            held = self._held.pop(delivery_tag, None)
        if held is None:
            return  # settled already, or taken without ack
        try:
            if how == "ack":
                self.client.ack(held.msg)
            elif how == "requeue":
                self.client.requeue(held.msg, delay=0)
            else:
                self.client.reject(held.msg, "rejected by the kombu consumer")
        except LeaseLost:
            log.warning(
                "%s of message %d in %s/%s came too late: its lease ran out and it "
                "was (or will be) delivered again",
                how,
                held.msg.id,
                held.msg.topic,
                held.msg.channel,
            )

    def _give_back(self, tags: Iterable[str]) -> None:
        """Release held deliveries at once; their attempt is not counted."""
        with self._lock:
            msgs = [h.msg for h in (self._held.pop(tag, None) for tag in tags) if h is not None]
        if msgs:
            self.client.release(msgs)

    def _ack_quietly(self, msgs: Sequence[novaque.Message]) -> None:
        lost = self.client.ack_many(msgs)
        if lost:
            log.warning("%d messages taken without ack were leased elsewhere first", len(lost))

    # -- lease renewal --------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        with self._lock:
            if self._heartbeat is not None:
                return
            thread = self._heartbeat = threading.Thread(
                target=self._renew_loop, name="novaque-kombu-heartbeat", daemon=True
            )
        thread.start()

    def _renew_loop(self) -> None:
        """Extend every held lease once half of it has passed."""
        while not self._stop.wait(self.lease / 4):
            now = time.monotonic()
            with self._lock:
                due = [(t, h) for t, h in self._held.items() if now - h.renewed >= self.lease / 2]
            for tag, held in due:
                if self._stop.is_set():
                    return
                try:
                    self.client.renew(held.msg, lease=self.lease)
                    held.renewed = time.monotonic()
                except LeaseLost:
                    with self._lock:
                        self._held.pop(tag, None)
                    log.warning(
                        "lost the lease of message %d in %s/%s while holding it",
                        held.msg.id,
                        held.msg.topic,
                        held.msg.channel,
                    )
                except Exception as exc:  # the database is away: try again next round
                    log.warning("could not renew a lease: %s", exc)

    # -- closing --------------------------------------------------------------------

    def close(self) -> None:
        if not self.closed:
            self._stop.set()
            for queue in sorted(self._auto_delete):
                try:
                    self.queue_delete(queue)
                except Exception as exc:
                    log.warning("could not delete auto-delete queue %s: %s", queue, exc)
            with self._lock:
                tags = [p["properties"]["delivery_tag"] for b in self._buffer.values() for p in b]
                self._buffer.clear()
            try:
                self._give_back(tags)
            except Exception as exc:  # they are delivered again when their leases run out
                log.warning("could not give back %d prefetched messages: %s", len(tags), exc)
        super().close()


def _payload(msg: novaque.Message) -> dict[str, Any]:
    """The kombu message a delivery carries, tagged with this lease."""
    payload: dict[str, Any] = json.loads(msg.body)
    properties = payload.setdefault("properties", {})
    properties["delivery_tag"] = f"{msg.delivery_id}.{msg.lease_token}"
    info = properties.setdefault("delivery_info", {})
    info["redelivered"] = msg.attempts > 1
    return payload


def _priority(value: Any) -> int:
    """A kombu message's ``priority`` (0-9, Celery's ``priority=``; 0 first, as
    kombu's Redis transport takes it) as novaque's: unchanged, an absent one 0
    and one outside 0-9 brought to the nearest end."""
    if value is None or isinstance(value, bool):
        return 0
    return min(max(int(value), 0), 9)


def _eta_delay(headers: dict[str, Any]) -> float | None:
    """Seconds until a Celery message's ``eta``, when it has one in the future."""
    eta = headers.get("eta")
    if not isinstance(eta, str):
        return None
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None  # local time of some host: the worker knows best
    delay = (when - datetime.now(timezone.utc)).total_seconds()
    if delay <= 0 or delay > _MAX_DELAY_S:
        return None
    return delay


_clients: dict[tuple[int, str, str], novaque.Client] = {}
_clients_lock = threading.Lock()
_maintained: set[int] = set()


def _forget_parent_clients() -> None:
    """In a forked child (Celery's prefork pool): leave the parent's connections alone."""
    global _clients_lock
    _clients_lock = threading.Lock()
    for client in _clients.values():
        client.engine.dispose(close=False)
        client.own_engine.dispose(close=False)
    _clients.clear()
    _maintained.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_clients)


class Transport(virtual.Transport):
    """The kombu transport ``novaque``: ``novaque+<SQLAlchemy URL>``."""

    Channel = Channel

    can_parse_url = True
    default_port = 0  # type: ignore[assignment]
    driver_type = "sql"
    driver_name = "novaque"
    polling_interval = 0.2
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        sa.exc.OperationalError,
        sa.exc.InterfaceError,
        novaque.DatabaseUnavailable,
    )
    implements = virtual.Transport.implements.extend(
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    #: How long what the database says of the topics and bindings is trusted
    #: (seconds, by the client's clock): a binding another process declares or
    #: removes is routed by and consumed from at most this much later.
    topics_ttl = 1.0

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        #: Per topic prefix: the topology read, and when.
        self._topology: dict[str, tuple[float, _Topology]] = {}

    def driver_version(self) -> str:
        return novaque.__version__

    def novaque_client(self) -> novaque.Client:
        """The process's novaque client for this connection's URL (made, and
        migrated unless ``migrate=False``, on first use)."""
        conninfo: Any = self.client
        url = conninfo.hostname
        if not url:
            raise ValueError("the broker URL names no database: use novaque+<SQLAlchemy URL>")
        transport_options: dict[str, Any] = conninfo.transport_options
        options: dict[str, Any] = dict(transport_options.get("options") or {})
        key = (os.getpid(), url, repr(sorted(options.items())))
        with _clients_lock:
            made = _clients.get(key)
            if made is None:
                made = novaque.connect(url, **options)
                if transport_options.get("migrate", True):
                    made.migrate()
                _clients[key] = made
        return made

    def start_maintenance(self, client: novaque.Client) -> None:
        """Run novaque's maintenance (reaper, TTL purge, stats) in consuming processes."""
        with _clients_lock:
            if id(client) in _maintained:
                return
            _maintained.add(id(client))
        client.start()

    def forget_topology(self) -> None:
        """Read the topics and bindings again at the next use."""
        self._topology.clear()

    def topology(self, client: novaque.Client, prefix: str) -> _Topology:
        """The topics under ``prefix`` and the queues bound on them, read again
        once :attr:`topics_ttl` has passed."""
        now = _seconds_now(client)
        read = self._topology.get(prefix)
        if read is not None and 0 <= now - read[0] < self.topics_ttl:
            return read[1]
        made = _Topology(parts_of(client).topology.channels_under(f"{prefix}::"))
        self._topology[prefix] = (now, made)
        return made


class _Topology:
    """The kombu topics in the database, and the topics each channel is on."""

    __slots__ = ("bindings", "topics")

    def __init__(self, channels_by_topic: dict[str, list[str]]) -> None:
        #: Every topic's name, sorted.
        self.topics = list(channels_by_topic)
        #: Per channel (a queue), the topics it is on, sorted.
        self.bindings: dict[str, list[str]] = {}
        for topic, names in channels_by_topic.items():
            for name in names:
                self.bindings.setdefault(name, []).append(topic)


def _seconds_now(client: novaque.Client) -> float:
    """Seconds for timing caches: by the client's clock when it has one
    (``Options.clock``, as in tests), else by the monotonic clock."""
    clock = client.options.clock
    return clock().timestamp() if clock is not None else time.monotonic()


def shutdown_clients(timeout: float = 10.0) -> None:
    """Shut down the clients the transport made in this process and forget them.

    For an application's exit, or a test between databases: the next
    connection makes a new client.
    """
    with _clients_lock:
        made = list(_clients.values())
        _clients.clear()
        _maintained.clear()
    for client in made:
        client.shutdown(timeout=timeout)
