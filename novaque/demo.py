"""A short tour on the embedded SQLite default: ``python -m novaque.demo``.

Publishes a few hundred order events to a topic with two channels, consumes
both channels with the low-level claim/ack API (one handler fails now and
then, so retries and dead letters show up) and prints what happened.
"""

from __future__ import annotations

import json
import os
import random
import sys

import novaque


def main(url: str | None = None, count: int = 300) -> int:
    url = url or os.environ.get("NOVAQUE_DATABASE_URL", "sqlite:///novaque.db")
    client = novaque.connect(url, default_max_attempts=3, backoff=novaque.Backoff(base=0))
    client.migrate()
    for channel in ("billing", "shipping"):
        client.ensure_channel("orders", channel)
    rng = random.Random(7)
    bodies = [json.dumps({"order": i, "total": rng.randint(5, 500)}) for i in range(count)]
    client.publish_many("orders", bodies)
    print(f"published {count} order events to 'orders' (channels: billing, shipping)")

    for channel, failure_rate in (("billing", 0.0), ("shipping", 0.1)):
        acked = retried = dead = 0
        while batch := client.claim("orders", channel, max_messages=50):
            for msg in batch:
                if rng.random() < failure_rate:
                    client.requeue(msg, error="carrier API timed out")
                    if msg.attempts >= msg.max_attempts:
                        dead += 1
                    else:
                        retried += 1
                else:
                    client.ack(msg)
                    acked += 1
        print(f"  {channel:9} acked {acked:4}  retried {retried:3}  dead letters {dead}")
    client.flush_stats()
    print(f"database: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
