"""Targets of the multi-process tests (spawned children import them from here).

Each child builds its own client from a URL, waits on a barrier so the
children really run at once, and reports its results on a queue.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import novaque


def _client(url: str, at: str) -> novaque.Client:
    fixed = datetime.fromisoformat(at)
    return novaque.connect(url, clock=lambda: fixed)


def publish_and_flush(url: str, at: str, count: int, acks: int, barrier: Any, out: Any) -> None:
    """Publish ``count`` messages and ack ``acks`` of them, flushing after every step.

    Every flush adds to the same (channel, day) bucket as the other child's.
    """
    client = _client(url, at)
    try:
        client.flush_stats()  # connect and check the schema before the race
        barrier.wait(timeout=60)
        for _ in range(count):
            client.publish("race", b"x")
            client.flush_stats()
        acked = 0
        while acked < acks:
            for msg in client.claim("race", "c", max_messages=min(10, acks - acked)):
                client.ack(msg)
                acked += 1
            client.flush_stats()
        out.put(("ok", acked))
    except BaseException as exc:  # report, so the parent fails with the cause
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        client.engine.dispose()


def publish_deduplicated(url: str, at: str, keys: list[str], barrier: Any, out: Any) -> None:
    """Publish one message per key, racing the other child on the same keys."""
    client = _client(url, at)
    try:
        client.list_topics()  # connect and check the schema before the race
        barrier.wait(timeout=60)
        ids = [client.publish("dedup", key.encode(), dedup_key=key) for key in keys]
        ids += client.publish_many(
            "dedup", [k.encode() for k in keys], dedup_keys=[k + "-many" for k in keys]
        )
        out.put(("ok", ids))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        client.engine.dispose()


def declare_kombu_queues(broker: str, declare: list[Any], out: Any) -> None:
    """Declare kombu queues and their bindings in this process, then report.

    ``declare``: ``(queue, exchange, exchange type, routing key)`` each; an
    exchange ``None`` unbinds the queue from the binding that follows it
    (``(queue, None, exchange, type, key)``) instead.
    """
    import kombu.pools

    import novaque.kombu
    from kombu import Connection, Exchange, Queue

    try:
        with Connection(broker) as conn:
            channel = conn.default_channel
            for item in declare:
                if item[1] is None:
                    queue, _, exchange, kind, key = item
                    Exchange(exchange, kind)(channel).declare()
                    channel.queue_unbind(queue, exchange, key)
                    continue
                queue, exchange, kind, key = item
                Queue(queue, Exchange(exchange, kind), key)(channel).declare()
        out.put(("ok", len(declare)))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        kombu.pools.reset()
        novaque.kombu.shutdown_clients()
